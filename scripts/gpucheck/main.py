"""Every GPU check in one run; scripts/gpu_check.sh says how to run it on the device.

    python -m gpucheck.main OUT_DIR        (GPU_CHECK_DRY_RUN=1: on the CPU, common.py)

Each stage is a process of its own (a crash or a hang costs that stage only) with a time
limit inside one overall budget (GPU_CHECK_BUDGET_S, default 330 s); stages the budget no
longer allows are reported as not run. After every stage OUT_DIR/summary.txt is written
again (its first line: PASS, FAIL naming the failed stages, or INCOMPLETE naming the
last one done), so a run cut off says how far it got; also OUT_DIR/gpu_check.json (every
result) and OUT_DIR/log.txt (every stage's output).

Exit status: 0 every check passed; 1 a check failed or did not run; 3 no CUDA device.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from gpucheck.common import DRY_RUN, REPO, WORK, dump, log
from gpucheck.summary import summary

NO_DEVICE = 3


class Runner:
    def __init__(self, out: Path, budget_s: float) -> None:
        self.out, self.deadline = out, time.monotonic() + budget_s
        self.results: dict[str, Any] = {}
        self.logf: TextIO = (out / "log.txt").open("a", buffering=1)

    def start(self, name: str, argv: list[str]) -> tuple[str, subprocess.Popen[bytes], float]:
        log(f"step {name}: start")
        self.logf.write(f"\n===== {name}: {' '.join(argv)}\n")
        proc = subprocess.Popen(argv, cwd=REPO, stdout=self.logf, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        return name, proc, time.monotonic()

    def finish(self, step: tuple[str, subprocess.Popen[bytes], float], limit_s: float) -> None:
        name, proc, began = step
        wait = min(limit_s - (time.monotonic() - began), self.deadline - time.monotonic())
        try:
            code: int | str = proc.wait(timeout=max(wait, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = f"stopped after {time.monotonic() - began:.0f} s (time limit)"
        path = WORK / f"{name}.json"  # a step that writes none passes by its exit status
        if code == 0:
            result = json.loads(path.read_text()) if path.exists() else {"ok": True}
        else:
            result = {"ok": False, "error": f"exit {code} (see log.txt)"}
        result["seconds"] = round(time.monotonic() - began, 1)
        self.results[name] = result
        log(f"step {name}: {'PASS' if result.get('ok') else 'FAIL'} in {result['seconds']} s")
        self.save()

    def step(self, name: str, limit_s: float, argv: list[str] | None = None) -> None:
        if self.deadline - time.monotonic() < 20:
            self.results[name] = {"ok": False, "error": "not run: out of time"}
            log(f"step {name}: NOT RUN (out of time)")
            return
        self.finish(self.start(name, argv or module(name)), limit_s)

    def save(self) -> None:
        dump(self.out / "gpu_check.json", self.results)
        (self.out / "summary.txt").write_text(summary(self.results, STAGES))


def module(name: str) -> list[str]:
    return [sys.executable, "-m", f"gpucheck.{name}", str(WORK / f"{name}.json")]


STAGES = ("versions", "checkpoints", "attention", "engines", "mps", "memory", "throughput",
          "suite")  # fmt: skip


def main() -> int:
    out = Path(sys.argv[1]).absolute()
    out.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    for stale in WORK.glob("*.json"):
        stale.unlink()
    run = Runner(out, float(os.environ.get("GPU_CHECK_BUDGET_S", "330")))
    run.step("versions", 30)
    if not DRY_RUN and not run.results["versions"].get("cuda_available"):
        run.results["status"] = "NO DEVICE: no CUDA device, nothing was checked"
        run.save()
        log("no CUDA device: nothing to check (summary in OUT/summary.txt)")
        return NO_DEVICE
    # Kernel compilation (attention) is CPU work, the checkpoints GPU and disk work: overlap.
    shaped = run.start("checkpoints", module("checkpoints"))
    attention = run.start("attention", module("attention"))
    run.finish(shaped, 120)
    run.finish(attention, 240)
    run.step("engines", 90)
    run.step("mps", 120)
    run.step("memory", 60)
    run.step("throughput", 120)
    run.step("suite", 150)
    run.save()
    failed = [k for k, v in run.results.items() if isinstance(v, dict) and not v.get("ok")]
    log(f"done: {'ALL PASS' if not failed else 'FAILED: ' + ', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
