"""The forward-only ceiling of one daemon run, from the engines' counters around it.

Each engine counts its forwards exactly, never through a window (`trd/engines/stats.py`):
steps, request-rows, seconds in forwards, rows whose candidate token was dropped. Over a
run engine m spent F_m = (busy_s after - busy_s before) in forwards, and the forwards
alone bound the run's wall time:

    engines in parallel (each on cores or a device of its own)   wall >= max_m F_m
    engines sharing one device (their forwards serialise)         wall >= sum_m F_m

ceiling = the run's output tokens / that bound; fraction = throughput / ceiling =
bound / wall, at most 100% when the bound applies. F_m includes the rows spent on
dropped candidates (R-Stitch drops the small model's token when it escalates: that
forward commits nothing); they are counted per model next to the rows that committed.

The counters must account for exactly the run's tokens (sum of committed tokens ==
the client's count); when they do not, the snapshots missed steps or something else
ran, and the ceiling is marked invalid with the two counts.

Handoff latency (send -> runnable on the peer): the engines keep their latest
`WINDOW` latencies and count them all; a run with more handoffs is summarised over
the latest `WINDOW` per engine, and the result says how many of how many.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trd.bench.record import Record
from trd.bench.stats import percentile
from trd.engines.stats import WINDOW

Snapshot = Mapping[str, Mapping[str, Any]]  # engine name -> its raw Stats body


def bound_kind(device: str, cores: int, engines: int, threads: int) -> dict[str, str]:
    """Which bound applies, and why, for engines of `threads` threads on `device`."""
    if device == "cpu" and cores >= engines * threads:
        why = f"{engines} engines x {threads} thread(s) on {cores} cores: forwards overlap"
        return {"kind": "parallel", "why": why}
    why = f"{engines} engines share {device} ({cores} cores): forwards serialise"
    return {"kind": "shared", "why": why}


def counter_delta(before: Mapping[str, Any], after: Mapping[str, Any], key: str) -> float:
    return float(after.get(key, 0)) - float(before.get(key, 0))


def engine_work(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    steps, rows = counter_delta(before, after, "steps"), counter_delta(before, after, "rows")
    busy, dropped = counter_delta(before, after, "busy_s"), counter_delta(before, after, "dropped")
    return {
        "steps": int(steps), "rows": int(rows), "forward_s": busy,
        "committed": int(counter_delta(before, after, "tokens_committed")),
        "fed": int(counter_delta(before, after, "tokens_fed")),
        "wide": int(counter_delta(before, after, "wide_forwards")),
        "handoffs_in": int(counter_delta(before, after, "handoffs_in")),
        "prefills_ahead": int(counter_delta(before, after, "prefills_ahead")),
        "prefills_adopted": int(counter_delta(before, after, "prefills_adopted")),
        "prefills_late": int(counter_delta(before, after, "prefills_late")),
        "dropped_rows": int(dropped), "dropped_share": dropped / rows if rows else 0.0,
        "batch_size_mean": rows / steps if steps else 0.0,
        "step_ms_mean": 1e3 * busy / steps if steps else 0.0,
        "ms_per_row": 1e3 * busy / rows if rows else 0.0,
    }  # fmt: skip


def handoff_latency(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """The run's handoff latencies, in microseconds: p50, p99, and how many were seen."""
    sample: list[float] = []
    total = 0
    for name, body in after.items():
        count = int(counter_delta(before.get(name, {}), body, "handoffs_in"))
        window = body.get("window", {}).get("handoff_s", [])
        total += count
        sample += window[len(window) - min(count, len(window)) :] if count else []
    us = [1e6 * s for s in sample]
    return {
        "count": total, "sampled": len(sample), "window": WINDOW,
        "p50_us": percentile(us, 50) if us else None,
        "p99_us": percentile(us, 99) if us else None,
    }  # fmt: skip


def ceiling(
    before: Snapshot,
    after: Snapshot,
    records: Sequence[Record],
    wall: float,
    bound: Mapping[str, str],
) -> dict[str, Any]:
    """The run's forward-only ceiling under `bound` (see the module docstring)."""
    tokens = sum(r.output_tokens for r in records)
    models = {name: engine_work(before.get(name, {}), after[name]) for name in after}
    forward = [m["forward_s"] for m in models.values()]
    bound_s = max(forward, default=0.0) if bound["kind"] == "parallel" else sum(forward)
    committed = sum(m["committed"] for m in models.values())
    out: dict[str, Any] = {
        "bound": dict(bound), "bound_s": bound_s, "models": models,
        "ceiling_throughput": tokens / bound_s if bound_s else None,
        "fraction": bound_s / wall if wall else None,
        "handoff": handoff_latency(before, after), "valid": committed == tokens,
    }  # fmt: skip
    if committed != tokens:
        out["invalid"] = f"the engines committed {committed} tokens, the client got {tokens}"
    return out
