"""Live estimates of the threshold model's inputs over sliding windows.

Engines record every routing transition and every step's (batch size, time);
these turn into the p, c and step_ms of a SystemSpec. Snapshots are plain
JSON-able dicts so the admin API can ship them to `trctl thresholds`.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from trd.batching.spec import SystemSpec


class RoutingStats:
    """The last `window` transitions (src, dst, committed tokens) of all requests."""

    def __init__(self, m: int, window: int) -> None:
        if m < 1 or window < 1:
            raise ValueError(f"need m >= 1 and window >= 1, got m={m}, window={window}")
        self.m = m
        self.window = window
        self._moves: deque[tuple[int, int, float]] = deque()
        self._count = np.zeros((m, m), dtype=np.int64)
        self._tokens = np.zeros((m, m), dtype=np.float64)

    def record(self, src: int, dst: int, tokens: float) -> None:
        if not (0 <= src < self.m and 0 <= dst < self.m):
            raise ValueError(f"transition {src}->{dst} outside models 0..{self.m - 1}")
        if len(self._moves) == self.window:
            old_src, old_dst, old_tokens = self._moves.popleft()
            self._count[old_src, old_dst] -= 1
            self._tokens[old_src, old_dst] -= old_tokens
        self._moves.append((src, dst, float(tokens)))
        self._count[src, dst] += 1
        self._tokens[src, dst] += tokens

    def p(self) -> np.ndarray:
        """Transition frequencies; a model with no data keeps its requests (p_ii = 1)."""
        rows = self._count.sum(axis=1, keepdims=True)
        p = np.where(rows > 0, self._count / np.maximum(rows, 1), 0.0)
        empty = rows[:, 0] == 0
        p[empty, empty] = 1.0
        return p

    def c(self) -> np.ndarray:
        """Mean committed tokens per transition; 1 where a transition was never seen."""
        return np.where(self._count > 0, self._tokens / np.maximum(self._count, 1), 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {"m": self.m, "window": self.window, "moves": [list(x) for x in self._moves]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RoutingStats:
        stats = cls(int(data["m"]), int(data["window"]))
        for src, dst, tokens in data["moves"]:
            stats.record(int(src), int(dst), float(tokens))
        return stats


class LatencyStats:
    """Each model's last `window` steps as (batch size, seconds)."""

    def __init__(self, m: int, window: int) -> None:
        if m < 1 or window < 1:
            raise ValueError(f"need m >= 1 and window >= 1, got m={m}, window={window}")
        self.m = m
        self.window = window
        self._steps: list[deque[tuple[int, float]]] = [deque(maxlen=window) for _ in range(m)]

    def record(self, model: int, batch: int, seconds: float) -> None:
        if not 0 <= model < self.m:
            raise ValueError(f"model {model} outside 0..{self.m - 1}")
        if batch < 1 or not seconds > 0:
            raise ValueError(f"need batch >= 1 and seconds > 0, got {batch}, {seconds}")
        self._steps[model].append((int(batch), float(seconds)))

    def step_ms(self, max_n: int) -> np.ndarray:
        """Latency table (m, max_n) in ms for batch sizes 1..max_n."""
        return np.stack([self._curve(i, max_n) for i in range(self.m)])

    def _curve(self, model: int, max_n: int) -> np.ndarray:
        steps = self._steps[model]
        if not steps:
            raise ValueError(f"model {model} has no latency observations")
        by_size: dict[int, list[float]] = {}
        for batch, seconds in steps:
            by_size.setdefault(batch, []).append(seconds * 1000.0)
        sizes = np.array(sorted(by_size), dtype=np.float64)
        # Medians ignore the odd step stretched by a hiccup (GC, a page fault).
        ms = np.array([np.median(by_size[int(s)]) for s in sizes])
        want = np.arange(1, max_n + 1, dtype=np.float64)
        if len(sizes) == 1:
            return np.full(max_n, ms[0])
        # Inside the observed sizes: interpolate. Outside: continue from the nearest
        # end with the least-squares slope, never falling as batches grow.
        slope = max(float(np.polyfit(sizes, ms, 1)[0]), 0.0)
        curve = np.interp(want, sizes, ms)
        above = want > sizes[-1]
        curve[above] = ms[-1] + slope * (want[above] - sizes[-1])
        below = want < sizes[0]
        # A smaller batch never costs less per request than the smallest observed
        # one, which keeps the extrapolation positive.
        curve[below] = np.maximum(
            ms[0] - slope * (sizes[0] - want[below]), ms[0] * want[below] / sizes[0]
        )
        return curve

    def to_dict(self) -> dict[str, Any]:
        return {
            "m": self.m,
            "window": self.window,
            "steps": [[list(x) for x in steps] for steps in self._steps],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LatencyStats:
        stats = cls(int(data["m"]), int(data["window"]))
        for model, steps in enumerate(data["steps"]):
            for batch, seconds in steps:
                stats.record(model, int(batch), float(seconds))
        return stats


def spec_from_stats(
    routing: RoutingStats, latency: LatencyStats, n: int, delta_ms: float
) -> SystemSpec:
    """A SystemSpec for up to n requests from the live estimates."""
    if routing.m != latency.m:
        raise ValueError(f"routing has {routing.m} models, latency {latency.m}")
    return SystemSpec(p=routing.p(), c=routing.c(), step_ms=latency.step_ms(n), delta_ms=delta_ms)
