"""Runs in stages on a scarce machine: each stage a process with its own time limit inside
one overall budget, the results and a summary rewritten after every stage, so a run cut
off still returns what it measured and says how far it got.

    runner = Stages(out_dir, budget_s, work, summarize)   # summarize(results) -> text
    runner.step("versions", 30, argv)                     # one stage, waited for
    a = runner.start("checkpoints", argv); b = runner.start("kernels", argv2)
    runner.finish(a, 120); runner.finish(b, 240)          # two at once

A stage writes its result to WORK/NAME.json (`Partial` rewrites it after each piece, so
a stage stopped at its limit keeps what it had measured); it passes when it exits 0 and
its JSON says "ok". Every stage's output goes to OUT/log.txt. `verdict` is the summary's
first line: PASS, FAIL naming the failed stages, or INCOMPLETE naming the last one done.
Used by the GPU check (scripts/gpucheck/) and `bench compare --plan gpu` (trd/bench/gpu/).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

START = time.monotonic()
Running = tuple[str, subprocess.Popen[bytes], float]


def log(msg: str) -> None:
    """One progress line: seconds since this process started, then the message."""
    print(f"[{time.monotonic() - START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def dump(path: str | Path, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=1, default=str))


class Partial:
    """A stage's result file, rewritten whenever a piece is added."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.data: dict[str, Any] = {}

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        dump(self.path, self.data)

    def append(self, key: str, value: Any) -> None:
        self.put(key, [*self.data.get(key, []), value])


def verdict(results: dict[str, Any], stages: Sequence[str]) -> str:
    """PASS (every stage ran and passed), FAIL naming the failed stages, or INCOMPLETE
    naming the last stage that ended (a run cut off, or still running)."""
    done = [s for s in stages if isinstance(results.get(s), dict)]
    failed = [s for s in done if not results[s].get("ok")]
    if failed:
        return f"FAIL: {', '.join(failed)} ({len(done)} of {len(stages)} stages ended)"
    if len(done) == len(stages):
        return f"PASS: all {len(stages)} stages"
    last = done[-1] if done else "none"
    return f"INCOMPLETE: {len(done)} of {len(stages)} stages passed, last {last}"


class Stages:
    def __init__(
        self, out: Path, budget_s: float, work: Path,
        summarize: Callable[[dict[str, Any]], str], results_name: str = "stages.json",
    ) -> None:  # fmt: skip
        self.out, self.work, self.summarize = out, work, summarize
        self.deadline = time.monotonic() + budget_s
        self.results: dict[str, Any] = {}
        self.results_name = results_name
        out.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        for stale in work.glob("*.json"):
            stale.unlink()
        self.logf: TextIO = (out / "log.txt").open("a", buffering=1)

    @property
    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def result_path(self, name: str) -> Path:
        return self.work / f"{name}.json"

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Running:
        log(f"stage {name}: start")
        self.logf.write(f"\n===== {name}: {' '.join(argv)}\n")
        proc = subprocess.Popen(argv, stdout=self.logf, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env={**os.environ, **(env or {})})  # fmt: skip
        return name, proc, time.monotonic()

    def finish(self, running: Running, limit_s: float) -> dict[str, Any]:
        name, proc, began = running
        wait = min(limit_s - (time.monotonic() - began), self.left_s)
        try:
            code: int | str = proc.wait(timeout=max(wait, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = f"stopped after {time.monotonic() - began:.0f} s (time limit)"
        path = self.result_path(name)  # a stage that writes none passes by its exit status
        partial = json.loads(path.read_text()) if path.exists() else {}
        result = {"ok": code == 0, **partial} if code == 0 else {**partial, "ok": False}
        if code != 0:
            result["error"] = f"exit {code} (see log.txt)"
        result["seconds"] = round(time.monotonic() - began, 1)
        self.results[name] = result
        log(f"stage {name}: {'PASS' if result.get('ok') else 'FAIL'} in {result['seconds']} s")
        self.save()
        return result

    def step(
        self, name: str, limit_s: float, argv: list[str], need_s: float = 20,
        env: dict[str, str] | None = None,
    ) -> dict[str, Any] | None:  # fmt: skip
        """Run one stage if at least `need_s` of the budget is left; else record it as
        not run (out of time)."""
        if self.left_s < need_s:
            self.results[name] = {"ok": False, "error": "not run: out of time"}
            log(f"stage {name}: NOT RUN (out of time)")
            self.save()
            return None
        return self.finish(self.start(name, argv, env), limit_s)

    def save(self) -> None:
        dump(self.out / self.results_name, self.results)
        (self.out / "summary.txt").write_text(self.summarize(self.results))
