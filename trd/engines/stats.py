"""Per-engine counters and sliding windows of live measurements.

The windows feed the Markov threshold model: step latency per batch size, and per
request-forward where the request went next and how many tokens were committed.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

WINDOW = 2048


@dataclass
class EngineStats:
    steps: int = 0
    tokens_committed: int = 0
    tokens_fed: int = 0
    handoffs_out: int = 0
    handoffs_in: int = 0
    latency: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    routes: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def record_step(self, batch_size: int, seconds: float, fed: int) -> None:
        self.steps += 1
        self.tokens_fed += fed
        self.latency.append((batch_size, seconds))

    def record_route(self, dst: int, committed: int) -> None:
        self.tokens_committed += committed
        self.routes.append((dst, committed))

    def snapshot(self) -> dict[str, Any]:
        sizes = [b for b, _ in self.latency]
        return {
            "steps": self.steps,
            "tokens_committed": self.tokens_committed,
            "tokens_fed": self.tokens_fed,
            "handoffs_out": self.handoffs_out,
            "handoffs_in": self.handoffs_in,
            "batch_size_mean": statistics.fmean(sizes) if sizes else 0.0,
            "step_ms_p50": 1e3 * statistics.median(s for _, s in self.latency)
            if self.latency
            else 0.0,
            "window": {
                "latency": [[b, s] for b, s in self.latency],
                "routes": [[d, c] for d, c in self.routes],
            },
        }
