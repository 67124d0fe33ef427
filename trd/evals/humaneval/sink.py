"""Where a HumanEval run keeps its answers while it runs, so that a run cut off resumes.

One JSON line an answer, appended as it comes: the problem, the load client's whole
`Record` (the text and token ids too), which run wrote it (its start, epoch seconds) and
when (seconds after that start). On opening, the answers already there are read back:
a rerun asks only the others. A failed request is written too, so the message can name
it, but counts as not answered: the rerun asks it again.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from trd.bench.record import Record


class Sink:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.run, self._t0 = time.time(), time.perf_counter()
        self.done: dict[str, Record] = {}
        self.failed: dict[str, str] = {}
        self._last: dict[float, float] = {}  # each run's time to its last answer
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    self._keep(row["task_id"], Record(**row["record"]), row["run"], row["at_s"])

    def _keep(self, task_id: str, rec: Record, run: float, at_s: float) -> None:
        if rec.ok:
            self.done[task_id] = rec
            self.failed.pop(task_id, None)
            self._last[run] = max(self._last.get(run, 0.0), at_s)
        else:
            self.failed[task_id] = str(rec.error)

    def add(self, task_id: str, rec: Record) -> None:
        at_s = time.perf_counter() - self._t0
        row = {"task_id": task_id, "run": self.run, "at_s": at_s, "record": asdict(rec)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self._keep(task_id, rec, self.run, at_s)

    def seconds(self) -> float:
        """The generating wall time of every run that answered into the sink, summed: each
        run's time to its last answer (a run cut off counts up to what it finished)."""
        return sum(self._last.values())
