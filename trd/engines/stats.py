"""Per-engine counters and sliding windows of live measurements.

The windows feed the Markov threshold model: step latency per batch size, and per
request-forward where the request went next and how many tokens were committed; `fed`
holds each of those steps' tokens fed (the benchmark's batching bound prices a step by it). The
counters never wrap into a window, so the difference of two snapshots is exact over any
stretch, however long: steps, request-rows forwarded (`rows`), seconds in forwards
(`busy_s`), rows whose candidate token was dropped (`dropped`: R-Stitch escalating),
seconds spent on grammar masks (`mask_s`, part of `busy_s`), prompts taken to prefill
ahead of their requests (`prefills_ahead`, engine.prefill_ahead), those of them that
became their request, its handoff arriving while they ran (`prefills_adopted`), and the
prompts long enough to prefill ahead that came too late, their request already here or
finished (`prefills_late`: the Submit and the first handoff travel by different links).
`handoff_s` holds the latest handoff latencies; `handoffs_in` counts them all. Of the
committed tokens and arrivals, `tokens_committed_own` and `handoffs_in_own` count those
of requests with their own routing (`routing` in the request), which the daemon's share
control leaves out (trd/supervisor/share.py).
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
    tokens_committed_own: int = 0
    handoffs_in_own: int = 0
    rows: int = 0
    busy_s: float = 0.0
    dropped: int = 0
    mask_s: float = 0.0  # seconds building and applying grammar masks (trd/engines/constrain)
    prefills_ahead: int = 0
    prefills_adopted: int = 0
    prefills_late: int = 0
    proposed: int = 0  # a draft model's proposals this engine verified (speculate.py)
    accepted: int = 0  # of them, those it committed
    latency: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    fed: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    routes: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    handoff_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def record_step(self, batch_size: int, seconds: float, fed: int) -> None:
        self.steps += 1
        self.rows += batch_size
        self.busy_s += seconds
        self.tokens_fed += fed
        self.latency.append((batch_size, seconds))
        self.fed.append(fed)

    def record_route(self, dst: int, committed: int, own: bool = False) -> None:
        """A row's route; `own`: its request has its own routing."""
        self.tokens_committed += committed
        self.tokens_committed_own += committed if own else 0
        self.dropped += committed == 0
        self.routes.append((dst, committed))

    def record_handoff(self, seconds: float, own: bool = False) -> None:
        self.handoffs_in += 1
        self.handoffs_in_own += own
        self.handoff_s.append(seconds)

    def snapshot(self) -> dict[str, Any]:
        sizes = [b for b, _ in self.latency]
        return {
            "steps": self.steps,
            "tokens_committed": self.tokens_committed,
            "tokens_fed": self.tokens_fed,
            "handoffs_out": self.handoffs_out,
            "handoffs_in": self.handoffs_in,
            "tokens_committed_own": self.tokens_committed_own,
            "handoffs_in_own": self.handoffs_in_own,
            "rows": self.rows,
            "busy_s": self.busy_s,
            "dropped": self.dropped,
            "mask_s": self.mask_s,
            "prefills_ahead": self.prefills_ahead,
            "prefills_adopted": self.prefills_adopted,
            "prefills_late": self.prefills_late,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "batch_size_mean": statistics.fmean(sizes) if sizes else 0.0,
            "step_ms_p50": 1e3 * statistics.median(s for _, s in self.latency)
            if self.latency
            else 0.0,
            "window": {
                "latency": [[b, s] for b, s in self.latency],
                "fed": list(self.fed),
                "routes": [[d, c] for d, c in self.routes],
                "handoff_s": list(self.handoff_s),
            },
        }
