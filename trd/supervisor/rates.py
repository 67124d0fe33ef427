"""Tokens/s and handoffs/s per engine over a sliding window, from the engines' Stats
counters: sampled by the daemon's controllers (trd/supervisor/control.py), shown by
`trctl status`."""

from __future__ import annotations

from collections import deque
from typing import Any

RATE_WINDOW_S = 10.0


class Rates:
    """Tokens/s and handoffs/s per engine over the last RATE_WINDOW_S, from Stats counters."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, dict[str, tuple[float, float]]]] = deque()

    def sample(self, stats: dict[str, dict[str, Any]], now: float) -> None:
        point = {
            name: (float(b.get("tokens_committed", 0)), float(b.get("handoffs_out", 0)))
            for name, b in stats.items()
        }
        if self.samples and any(
            point.get(n, (0.0, 0.0))[0] < old[0] for n, old in self.samples[-1][1].items()
        ):
            self.samples.clear()  # the engines restarted; their counters began again
        self.samples.append((now, point))
        while now - self.samples[0][0] > RATE_WINDOW_S:
            self.samples.popleft()

    def per_second(self) -> dict[str, tuple[float, float]]:
        """Rates over the window, for each engine seen in at least two samples."""
        if not self.samples:
            return {}
        t1, last = self.samples[-1]
        out = {}
        for name, (tokens, handoffs) in last.items():
            t0, first = next((t, p[name]) for t, p in self.samples if name in p)
            if t1 > t0:
                out[name] = ((tokens - first[0]) / (t1 - t0), (handoffs - first[1]) / (t1 - t0))
        return out
