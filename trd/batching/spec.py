"""Inputs of the delayed-batching throughput model: routing, tokens and latencies."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Tolerance for float noise in L / delta, so that 1.1 / 0.1 counts as 11 quanta, not 12.
_QUANTUM_SLACK = 1e-9


# eq=False: field-wise == on numpy arrays is ambiguous; specs compare by identity.
@dataclass(frozen=True, eq=False)
class SystemSpec:
    """M models sharing N closed-loop requests.

    p[i, j]: probability that a request finishing a step on model i goes to model j.
    c[i, j]: tokens committed by that transition (c[i, i] = 1 for a kept token).
    step_ms[i, b - 1]: latency of one step of model i with batch size b, for
        b = 1..max_n (measured points interpolated beforehand).
    delta_ms: time quantum; latencies are rounded up to whole quanta.
    """

    p: np.ndarray
    c: np.ndarray
    step_ms: np.ndarray
    delta_ms: float

    def __post_init__(self) -> None:
        p = np.array(self.p, dtype=np.float64)
        c = np.array(self.c, dtype=np.float64)
        step = np.array(self.step_ms, dtype=np.float64)
        if p.ndim != 2 or p.shape[0] != p.shape[1] or p.shape[0] == 0:
            raise ValueError(f"p must be a non-empty square matrix, got shape {p.shape}")
        if c.shape != p.shape:
            raise ValueError(f"c must have the shape of p {p.shape}, got {c.shape}")
        if step.ndim != 2 or step.shape[0] != p.shape[0] or step.shape[1] == 0:
            raise ValueError(f"step_ms must have shape ({p.shape[0]}, max_n), got {step.shape}")
        if not (np.isfinite(p).all() and np.isfinite(c).all() and np.isfinite(step).all()):
            raise ValueError("p, c and step_ms must be finite")
        if (p < 0).any():
            raise ValueError("p must be non-negative")
        sums = p.sum(axis=1)
        if not np.allclose(sums, 1.0, atol=1e-6):
            raise ValueError(f"rows of p must sum to 1, got {sums.tolist()}")
        if (c < 0).any():
            raise ValueError("c must be non-negative")
        if (step <= 0).any():
            raise ValueError("step_ms must be positive")
        if not (math.isfinite(self.delta_ms) and self.delta_ms > 0):
            raise ValueError(f"delta_ms must be positive, got {self.delta_ms}")
        # Rows may carry 1e-6 of slack; renormalise so probabilities sum to 1 exactly.
        object.__setattr__(self, "p", p / sums[:, None])
        object.__setattr__(self, "c", c)
        object.__setattr__(self, "step_ms", step)

    @property
    def m(self) -> int:
        """Number of models."""
        return int(self.p.shape[0])

    @property
    def max_n(self) -> int:
        """Largest batch size (and request count) the latency table covers."""
        return int(self.step_ms.shape[1])

    def quanta(self) -> np.ndarray:
        """Step latencies in whole quanta of delta_ms (at least 1), shape (M, max_n)."""
        q = np.ceil(self.step_ms / self.delta_ms - _QUANTUM_SLACK).astype(np.int64)
        return np.maximum(q, 1)
