"""Every GPU check in one run; scripts/gpu_check.sh says how to run it on the device.

    python -m gpucheck.main OUT_DIR        (GPU_CHECK_DRY_RUN=1: on the CPU, common.py)

Each stage is a process of its own (a crash or a hang costs that stage only) with a time
limit inside one overall budget (GPU_CHECK_BUDGET_S, default 330 s); stages the budget no
longer allows are reported as not run (trd/bench/stages.py). After every stage
OUT_DIR/summary.txt is written again (its first line: PASS, FAIL naming the failed
stages, or INCOMPLETE naming the last one done), so a run cut off says how far it got;
also OUT_DIR/gpu_check.json (every result) and OUT_DIR/log.txt (every stage's output).

Exit status: 0 every check passed; 1 a check failed or did not run; 3 no CUDA device.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpucheck.common import DRY_RUN, WORK
from gpucheck.summary import summary
from trd.bench.stages import Stages, log

NO_DEVICE = 3
STAGES = ("versions", "checkpoints", "attention", "engines", "mps", "memory", "throughput",
          "suite")  # fmt: skip


def module(name: str) -> list[str]:
    return [sys.executable, "-m", f"gpucheck.{name}", str(WORK / f"{name}.json")]


def main() -> int:
    out = Path(sys.argv[1]).absolute()
    budget = float(os.environ.get("GPU_CHECK_BUDGET_S", "330"))
    run = Stages(out, budget, WORK, lambda r: summary(r, STAGES), "gpu_check.json")
    run.step("versions", 30, module("versions"))
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
    for name, limit in (("engines", 90), ("mps", 120), ("memory", 60), ("throughput", 120),
                        ("suite", 150)):  # fmt: skip
        run.step(name, limit, module(name))
    run.save()
    failed = [k for k, v in run.results.items() if isinstance(v, dict) and not v.get("ok")]
    log(f"done: {'ALL PASS' if not failed else 'FAILED: ' + ', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
