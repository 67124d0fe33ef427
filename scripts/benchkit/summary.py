"""Summaries of one run: throughput, latency percentiles, and the forward-only ceiling.

The ceiling is what the engines' forwards alone would allow: for each model, its mean
step latency per request-row at the batch sizes the run actually used (from the
engine's live window) times the tokens that model made; the sum over models is the
forward-only time of the run, and ceiling throughput = output tokens / that time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from benchkit.client import Record


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def summarize(records: Sequence[Record], wall: float, large: str = "large") -> dict[str, Any]:
    tokens = sum(r.output_tokens for r in records)
    out: dict[str, Any] = {
        "requests": len(records),
        "wall_s": wall,
        "output_tokens": tokens,
        "throughput": tokens / wall,
        "large_fraction": sum(r.tokens_per_model.get(large, 0) for r in records) / max(1, tokens),
        "handoffs_per_request": sum(r.handoffs for r in records) / max(1, len(records)),
    }
    for key in ("ttft", "tpot", "latency"):
        vals = [getattr(r, key) for r in records]
        out.update({f"{key}_p{q}": pct(vals, q) for q in (50, 90, 99)})
    return out


def steps_of_run(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[int, float]]:
    """The (batch size, seconds) samples of the steps between two raw Stats bodies."""
    window = after["window"]["latency"]
    run = after["steps"] - before["steps"]
    return [(int(b), float(s)) for b, s in window[-run:]] if run > 0 else []


def ceiling(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], records: Sequence[Record]
) -> dict[str, Any]:
    """Forward-only ceiling of a run from the engines' raw stats before and after it."""
    tokens = sum(r.output_tokens for r in records)
    per_model: dict[str, Any] = {}
    forward_only, slowest = 0.0, 0.0
    for name in after:
        steps = steps_of_run(before.get(name, {"steps": 0}), after[name])
        made = sum(r.tokens_per_model.get(name, 0) for r in records)
        rows = sum(b for b, _ in steps)
        per_row = sum(s for _, s in steps) / rows if rows else 0.0
        forward_only += per_row * made
        slowest = max(slowest, per_row * made)
        per_model[name] = {
            "steps": len(steps),
            "batch_size_mean": rows / len(steps) if steps else 0.0,
            "step_ms_mean": 1e3 * sum(s for _, s in steps) / len(steps) if steps else 0.0,
            "tokens": made,
        }
    return {
        "forward_only_s": forward_only,
        "ceiling_throughput": tokens / forward_only if forward_only else 0.0,
        # Engines on separate cores overlap: then the busiest model alone bounds the run.
        "parallel_ceiling_throughput": tokens / slowest if slowest else 0.0,
        "models": per_model,
    }
