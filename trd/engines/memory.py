"""A process's memory as the kernel and glibc's malloc see it. Pure Python, no torch.

    resident()   resident bytes: all, anonymous, file-backed, shared memory (/proc)
    heap()       glibc's malloc: bytes in use, free in its arenas, mmapped (mallinfo2)
    Trimmer      gives the heap's free pages back to the kernel now and then (malloc_trim)

Every engine reports both in its Stats (`memory`), and the supervisor its own resident
bytes: `trctl status` and /metrics show them, and `tokenrouterd bench serve --duration`
samples them to tell warm-up from growth.

What an engine's resident size is made of on CPU (issue 54, the Qwen demo pair): the
weights are file pages (safetensors maps the checkpoint; all of them are read in at
load, `trd.models.loader.map_in`), the KV pool and the workspaces anonymous memory
written at start, and the rest the heap: Python's objects and each step's tensors. The
heap keeps what a step freed (tens of MB after a long prefill) for the next step, so
`heap_free_bytes` moves with the traffic's shapes; it is not a leak unless
`heap_in_use_bytes` keeps rising with requests served. What is free stays resident
until it is given back: glibc returns only the top of an arena by itself, so a heap
fragmented by steps of many shapes held it for good (a 61-minute soak of the int8 demo:
the small engine +1.65% resident, all of it free heap). The engine's loop calls a
Trimmer, which runs malloc_trim(0) (every free page of every arena back to the kernel,
MADV_DONTNEED) at most every TRIM_INTERVAL_S and only with more than TRIM_SLACK_BYTES
free: a few ms, and the next step faults back in only the pages it uses.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from pathlib import Path
from typing import Any

TRIM_INTERVAL_S = 10.0
TRIM_SLACK_BYTES = 16 << 20

# /proc/self/status keys (kB) -> our names (bytes)
_STATUS = {"VmRSS": "rss_bytes", "RssAnon": "anon_bytes", "RssFile": "file_bytes",
           "RssShmem": "shmem_bytes"}  # fmt: skip


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost",
    )]  # fmt: skip


def resident(pid: int | str = "self") -> dict[str, int]:
    """Resident bytes of process `pid` (this one by default): `rss_bytes` and its parts,
    anonymous, file-backed (mapped weights, libraries) and shared memory (the rings);
    {} where /proc cannot tell (not Linux, or no such process)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in _STATUS:
            out[_STATUS[key]] = int(value.split()[0]) * 1024
    return out


@functools.cache
def _libc() -> Any:
    """glibc (or whatever C library this process runs on), or None."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None)
    except OSError:
        return None


@functools.cache
def _mallinfo2() -> Any:
    """glibc's mallinfo2 (2.33 and later), or None."""
    fn = getattr(_libc(), "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = _MallInfo2
    return fn


def heap() -> dict[str, int]:
    """This process's malloc heap, summed over glibc's arenas: `heap_in_use_bytes`
    (allocated), `heap_free_bytes` (freed, kept in the arenas), `heap_mmap_bytes` (large
    blocks mapped apart); {} without glibc."""
    fn = _mallinfo2()
    if fn is None:
        return {}
    info = fn()
    return {
        "heap_in_use_bytes": info.uordblks,
        "heap_free_bytes": info.fordblks,
        "heap_mmap_bytes": info.hblkhd,
    }


class Trimmer:
    """malloc_trim(0) when the heap holds more than `slack` bytes free, at most once per
    `interval` seconds; `trims` counts the calls (reported with the engine's memory)."""

    def __init__(self, interval: float = TRIM_INTERVAL_S, slack: int = TRIM_SLACK_BYTES):
        self.interval = interval
        self.slack = slack
        self.trims = 0
        self._last = float("-inf")
        self._fn = getattr(_libc(), "malloc_trim", None)

    def tick(self, now: float) -> bool:
        """Trim if it is due (`now`: time.perf_counter()); True when it trimmed."""
        if self._fn is None or now - self._last < self.interval:
            return False
        self._last = now
        if heap().get("heap_free_bytes", 0) <= self.slack:
            return False
        self._fn(ctypes.c_size_t(0))
        self.trims += 1
        return True
