"""Counter-based random numbers: a uniform draw that depends only on (seed, counter).

Sampling and the ensemble policy draw by (seed, position), so a draw is the same on
whichever engine makes the position, alone or batched, and in the reference loop.
"""

from __future__ import annotations

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def uniform(seed: int, counter: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, counter)."""
    return (_splitmix64(_splitmix64(seed) ^ counter) >> 11) * (1.0 / (1 << 53))
