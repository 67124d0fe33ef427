"""The one result schema: every benchmark (and evaluation) JSON is a `Result`.

    {"schema": "tokenrouterd-result/1", "kind": "bench serve",
     "command": ["tokenrouterd", "bench", "serve", ...],
     "git": {"commit": "79f4b5d...", "dirty": false}, "version": "0.1.0",
     "started": "2026-12-07T10:00:00Z", "finished": "...", "wall_s": 81.2,
     "machine": {"cores": 2, "cpu": "...", "memory_gib": 7.8, "python": "3.11.9",
                 "start": {"load": [1.9, 1.7, 1.5], "memory_available_gib": 5.1},
                 "end": {...}},
     "systems": {name: the config of every system measured},
     "runs": [{"system": name, ..., "summary": {...}, "records": [per request]}],
     ...}  (kind-specific keys beside these)

The machine's load average is taken when the run starts and when it ends: a run on a
busy host says so in its own file. `git` is the checkout the code ran from (None when
it is not a git checkout, e.g. an installed wheel), dirty when tracked files differ
from the commit.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trd import version

SCHEMA = "tokenrouterd-result/1"
ROOT = Path(__file__).resolve().parents[2]  # the checkout (or site-packages) holding trd


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def git_state(root: Path = ROOT) -> dict[str, Any] | None:
    """{"commit", "dirty"} of the checkout at `root`, or None outside one."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                              text=True, timeout=30, check=True)  # fmt: skip
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def _meminfo() -> dict[str, float]:
    """MemTotal and MemAvailable in GiB (Linux; {} elsewhere)."""
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(rest.split()[0]) / 2**20
    except OSError:
        pass
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_now() -> dict[str, Any]:
    """The machine's load at this moment: 1/5/15-minute load average, memory available."""
    return {"load": [round(x, 2) for x in os.getloadavg()],
            "memory_available_gib": round(_meminfo().get("MemAvailable", 0.0), 2)}  # fmt: skip


def machine() -> dict[str, Any]:
    """What the machine is (its load is taken apart, at start and end)."""
    return {
        "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
        "cpu": _cpu_model(), "memory_gib": round(_meminfo().get("MemTotal", 0.0), 2),
        "python": platform.python_version(), "platform": platform.platform(),
    }  # fmt: skip


class Result:
    """One benchmark's result, written as JSON: open it when the run starts (the load
    then), add systems and runs, `write` it when the run ends (the load then)."""

    def __init__(self, kind: str, command: list[str] | None = None) -> None:
        self._started = time.perf_counter()
        self.body: dict[str, Any] = {
            "schema": SCHEMA, "kind": kind,
            "command": command if command is not None else [Path(sys.argv[0]).name, *sys.argv[1:]],
            "git": git_state(), "version": version(), "started": _now(),
            "machine": {**machine(), "start": load_now()}, "systems": {}, "runs": [],
        }  # fmt: skip

    def system(self, name: str, config: dict[str, Any]) -> None:
        """The config of a system measured (what it ran, how it was started)."""
        self.body["systems"][name] = config

    def run(self, run: dict[str, Any]) -> None:
        self.body["runs"].append(run)

    def add(self, **fields: Any) -> None:
        """Keys of this kind of result (`runs` and `systems` replace the lists so far)."""
        self.body.update(fields)

    def finish(self) -> dict[str, Any]:
        self.body["machine"]["end"] = load_now()
        self.body["finished"] = _now()
        self.body["wall_s"] = round(time.perf_counter() - self._started, 3)
        return self.body

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.finish(), indent=1) + "\n")
        return path
