"""The one percentile definition of the project, and the summary every result reports.

Percentiles interpolate linearly between the two closest ranks (Hyndman and Fan's type
7, numpy's default `method="linear"`, the one vLLM's and SGLang's benchmarks report):
for sorted values x[0..n-1] the q-th percentile sits at rank h = (n - 1) q / 100 and is
x[floor h] + (h - floor h) (x[floor h + 1] - x[floor h]). So p50 of [1, 2, 3, 4] is 2.5,
p99 of 1..100 is 99.01, and one value is every percentile of itself.

A summary is mean, p50, p90 and p99 of one quantity; no values give None for each (a
run that measured nothing must not read as zero latency).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

QUANTILES = (50, 90, 99)


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of `values`, linearly interpolated."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile: q must be in 0..100, got {q}")
    h = (len(xs) - 1) * q / 100
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


def summary(values: Iterable[float], scale: float = 1.0) -> dict[str, float | None]:
    """{"mean", "p50", "p90", "p99"} of `values` times `scale` (1e3: seconds -> ms)."""
    xs = [scale * v for v in values]
    if not xs:
        return {"mean": None, **{f"p{q}": None for q in QUANTILES}}
    return {"mean": sum(xs) / len(xs), **{f"p{q}": percentile(xs, q) for q in QUANTILES}}
