"""From the engines' live Stats windows to recommended delayed-batching thresholds.

Each engine reports a sliding window of (batch size, step seconds) and, per request it
ran, (destination model, committed tokens). Those feed `RoutingStats`/`LatencyStats`,
the Markov model ranks every valid threshold vector per concurrency level, and the
result is a per-model table indexed by the active request count, the form the engines
consume.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trd.batching.estimates import LatencyStats, RoutingStats, spec_from_stats
from trd.batching.markov import throughput
from trd.batching.search import recommend, to_table

LEVELS = (1, 2, 4, 8, 16)


def estimates(stats: Mapping[int, Mapping[str, Any]]) -> tuple[RoutingStats, LatencyStats]:
    m = len(stats)
    routing, latency = RoutingStats(m, window=1 << 16), LatencyStats(m, window=1 << 16)
    for model, body in stats.items():
        window = body.get("window", {})
        for batch, seconds in window.get("latency", []):
            latency.record(model, int(batch), float(seconds))
        for dst, committed in window.get("routes", []):
            routing.record(model, int(dst), float(committed))
    return routing, latency


def current_table(stats: Mapping[int, Mapping[str, Any]], max_n: int) -> list[list[int]]:
    """The thresholds the engines run now, expanded to one entry per n = 1..max_n."""
    table = []
    for model in sorted(stats):
        b = list(stats[model].get("thresholds", [1]))
        table.append([b[min(n, len(b)) - 1] for n in range(1, max_n + 1)])
    return table


def recommend_live(
    stats: Mapping[int, Mapping[str, Any]],
    levels: Sequence[int] = LEVELS,
    delta_ms: float | None = None,
) -> dict[str, Any]:
    """Recommended table, and predicted tokens/s per level for it and for the current one."""
    routing, latency = estimates(stats)
    max_n = max(levels)
    if delta_ms is None:
        # State counts grow with (step / delta) ** (models - 1): keep the quantum a
        # fixed fraction of the fastest step, coarser for three or more models.
        fastest = float(latency.step_ms(1).min())
        delta_ms = fastest / (10 if len(stats) == 2 else 4)
    spec = spec_from_stats(routing, latency, max_n, delta_ms)
    results = recommend(spec, levels, fixed={0: 1})
    current = current_table(stats, max_n)
    rows = []
    for n, res in sorted(results.items()):
        now = [current[i][n - 1] for i in range(len(current))]
        valid = sum(b - 1 for b in now) < n
        rows.append({
            "n": n,
            "recommended": list(res.thresholds),
            "predicted_tok_s": res.tokens_per_s,
            "current": now,
            "current_predicted_tok_s": throughput(spec, n, now) if valid else None,
        })  # fmt: skip
    return {
        "delta_ms": delta_ms,
        "p": spec.p.tolist(),
        "c": spec.c.tolist(),
        "levels": rows,
        "table": to_table(results, len(stats)),
    }
