"""A daemon's processes over a run, from its admin API (`GET /status`): the samples
`bench serve --duration` takes (`soak.py`) and what it concludes from them.

    snapshot     one sample: each process's memory (the supervisor's and each engine's
                 `trd/engines/memory.py` figures), each engine's KV pages in use and
                 live structures, the requests in flight
    growth       per process, over the samples after the warm-up: the least-squares
                 slope of a figure and the growth it makes, in % of the resident size
    settle       wait until the daemon holds no request (the end of a run)
    left_behind  what the last sample still holds: requests, KV pages
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from trd.cli import AdminError, request

Sample = dict[str, Any]
SUPERVISOR = "supervisor"
# Live structures of an engine, in its Stats "live" (trd/engines/loop.py).
LIVE = ("requests", "prefix_blocks", "grammars_cached", "finished_remembered")
SETTLE_S = 30.0  # after the load: how long the daemon may take to let go of every request


def snapshot(status: dict[str, Any], t: float, done: int) -> Sample:
    """One sample from an admin `/status` answer: each process's memory, each engine's
    KV pages in use and live structures, the requests in flight."""
    procs = {SUPERVISOR: {"pid": status["pid"], **(status.get("memory") or {})}}
    for e in status["engines"]:
        live = e.get("live") or {}
        procs[e["name"]] = {"pid": e["pid"], **(e.get("memory") or {}),
                            "kv_pages_used": e.get("kv_pages_used"),
                            **{k: live.get(k) for k in LIVE}}  # fmt: skip
    return {"t_s": round(t, 1), "requests_done": done,
            "active_requests": status["active_requests"], "processes": procs}  # fmt: skip


def growth(
    samples: Sequence[Sample], warmup_s: float, key: str = "rss_bytes", of: str = "rss_bytes"
) -> dict[str, Any]:
    """Per process, over the samples from `warmup_s` on: `key` at the first and the last,
    its least-squares slope (per hour) and the growth that makes over their span, as a
    percentage of `of` (the resident size) at the first; {} with fewer than 3 samples."""
    after = [s for s in samples if s["t_s"] >= warmup_s]
    if len(after) < 3:
        return {}
    out = {}
    for name in after[0]["processes"]:
        points = [(s["t_s"], p.get(key), p.get(of)) for s in after
                  if (p := s["processes"].get(name)) is not None]  # fmt: skip
        points = [x for x in points if isinstance(x[1], int | float)]
        if len(points) < 3:
            continue
        ts, vs, bases = zip(*points, strict=True)
        slope = statistics.linear_regression(ts, vs).slope
        span = ts[-1] - ts[0]
        out[name] = {"from_s": ts[0], "to_s": ts[-1], "first": vs[0], "last": vs[-1],
                     "slope_per_h": slope * 3600,
                     "growth_pct": 100 * slope * span / bases[0] if bases[0] else None}  # fmt: skip
    return out


async def sample_loop(
    admin: str, token: str, every: float, until: float, start: float,
    done: Sequence[object], samples: list[Sample],
) -> None:  # fmt: skip
    """Sample every `every` seconds up to `until` (perf_counter), printing a line each."""
    while True:
        now = time.perf_counter()
        try:
            status = await asyncio.to_thread(request, admin, "GET", "/status", None, token)
        except AdminError as exc:
            print(f"  {now - start:7.0f} s: no sample: {exc}", file=sys.stderr)
        else:
            samples.append(snapshot(status, now - start, len(done)))
            print("  " + describe(samples[-1]), file=sys.stderr)
        if now >= until:
            return
        await asyncio.sleep(max(0.0, min(every, until - time.perf_counter())))


def describe(s: Sample) -> str:
    mem = ", ".join(f"{name} {p.get('rss_bytes', 0) / 2**20:,.0f} MiB"
                    for name, p in s["processes"].items())  # fmt: skip
    return f"{s['t_s'] / 60:6.1f} min, {s['requests_done']} requests: {mem}"


async def settle(admin: str, token: str, timeout: float = SETTLE_S) -> None:
    """Wait until the daemon holds no request: none in flight, none on any engine (the
    aborts of the last cut streams take a moment); at most `timeout` seconds, after
    which the last sample shows what was left behind."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        try:
            status = await asyncio.to_thread(request, admin, "GET", "/status", None, token)
        except AdminError:
            return
        held = [(e.get("live") or {}).get("requests") for e in status["engines"]]
        if status["active_requests"] == 0 and not any(held):
            return
        await asyncio.sleep(0.5)


def left_behind(samples: Sequence[Sample]) -> dict[str, int]:
    """What the last sample (taken once the daemon settled) still holds: requests in
    flight, and per engine requests and KV pages in use; {} when nothing."""
    if not samples:
        return {}
    last = samples[-1]
    left = {"in flight": last["active_requests"]}
    for name, p in last["processes"].items():
        if name != SUPERVISOR:
            left |= {
                f"{name} requests": p.get("requests"),
                f"{name} kv pages": p.get("kv_pages_used"),
            }
    return {k: v for k, v in left.items() if v}
