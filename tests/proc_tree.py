"""Processes as the kernel sees them: a process's children, and whether any of its
threads still runs.

A process whose main thread has exited shows its leader as a zombie ("Z") in
/proc/<pid>/stat while its other threads go on running (and holding the GPU, the rings,
the port): the MPS control daemon was left that way (8a4a7c6). Such a process is alive.
"""

from __future__ import annotations

import os
from pathlib import Path


def _state(stat: Path) -> str | None:
    try:
        return stat.read_text().rpartition(")")[2].split()[0]
    except OSError:
        return None  # gone (or reaped) while we looked


def alive(pid: int) -> bool:
    """Whether any thread of `pid` exists and is not a zombie."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    return any(_state(Path(f"/proc/{pid}/task/{t}/stat")) not in (None, "Z") for t in tasks)


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid`."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry))
    return out
