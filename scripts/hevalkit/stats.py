"""pass@1 and paired bootstrap intervals over problems.

Greedy decoding gives one completion per problem, so pass@1 is the fraction of problems
whose completion passes. Two systems ran on the same problems: the paired bootstrap draws
the problems with replacement (the same draw for both) RESAMPLES times and takes the
2.5th and 97.5th percentiles of the difference of the means. The share of the gap
recovered, (S - small) / (large - small), is a ratio of such means; its interval comes
from the same draws (draws where large equals small are left out).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RESAMPLES = 10_000
SEED = 0


def pass_at_1(passed: Sequence[bool]) -> float:
    return float(np.mean(np.asarray(passed, dtype=np.float64))) if len(passed) else 0.0


def _draws(n: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def paired_interval(
    a: Sequence[float], b: Sequence[float], resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its paired bootstrap 95% interval (low, high)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.size == 0:
        raise ValueError(f"paired samples need equal, non-zero sizes: {x.size} and {y.size}")
    diffs = (x - y)[_draws(x.size, resamples, seed)].mean(axis=1)
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(x.mean() - y.mean()), float(low), float(high)


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
    ratios = (s[idx].mean(axis=1) - lo[idx].mean(axis=1))[keep] / gaps[keep]
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float((s.mean() - lo.mean()) / gap), float(low), float(high)
