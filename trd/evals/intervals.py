"""Intervals of pass rates: Wilson for one system, paired bootstrap between systems.

Greedy decoding gives one completion per problem, so pass@1 is the fraction of problems
whose completion passes. Its 95% interval is Wilson's score interval (closed form, never
outside [0, 1], sound at 0 and n passes): for k passes of n and z = 1.96,

    (p + z^2/2n -+ z sqrt(p(1 - p)/n + z^2/4n^2)) / (1 + z^2/n),   p = k/n.

Two systems ran on the same problems: the paired bootstrap draws the problems with
replacement (the same draw for both) RESAMPLES times and takes the 2.5th and 97.5th
percentiles (`trd.bench.stats.percentile`, the project's one definition) of the
difference of the means. The share of the gap recovered, (S - small) / (large - small),
is a ratio of such means; its interval comes from the same draws (draws where large
equals small are left out).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from trd.bench.stats import percentile

RESAMPLES = 10_000
SEED = 0
Z95 = 1.959963984540054  # the standard normal's 97.5th percentile


def pass_at_1(passed: Sequence[bool]) -> float:
    return sum(map(bool, passed)) / len(passed) if len(passed) else 0.0


def wilson(passed: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's 95% score interval (low, high) of a pass rate of `passed` out of `n`."""
    if not 0 <= passed <= n or n == 0:
        raise ValueError(f"wilson: need 0 <= passed <= n and n > 0, got {passed} of {n}")
    p, z2 = passed / n, z * z
    centre = p + z2 / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (centre - half) / (1 + z2 / n), (centre + half) / (1 + z2 / n)


def _draws(n: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _interval(values: np.ndarray) -> tuple[float, float]:
    xs = values.tolist()
    return percentile(xs, 2.5), percentile(xs, 97.5)


def paired_interval(
    a: Sequence[float], b: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its paired bootstrap 95% interval (low, high)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"paired samples need equal, non-zero sizes: {x.size} and {y.size}")
    low, high = _interval((x - y)[_draws(x.size, resamples, seed)].mean(axis=1))
    return float(x.mean() - y.mean()), low, high


def gap_recovered(
    system: Sequence[float],
    small: Sequence[float],
    large: Sequence[float],
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float, float] | None:
    """(S - small) / (large - small) and its paired bootstrap 95% interval; None when the
    large and the small system have the same mean (no gap to recover)."""
    s, lo, hi = (np.asarray(v, dtype=np.float64) for v in (system, small, large))
    if not s.shape == lo.shape == hi.shape or s.size == 0:
        raise ValueError("gap_recovered needs three samples of one non-zero size")
    gap = hi.mean() - lo.mean()
    if gap == 0:
        return None
    idx = _draws(s.size, resamples, seed)
    gaps = hi[idx].mean(axis=1) - lo[idx].mean(axis=1)
    keep = gaps != 0
    low, high = _interval((s[idx].mean(axis=1) - lo[idx].mean(axis=1))[keep] / gaps[keep])
    return float((s.mean() - lo.mean()) / gap), low, high
