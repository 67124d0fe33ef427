"""When an engine launches a forward: the delayed-batching rule. Pure Python, no torch.

Model i launches only when at least B_i requests are runnable on it, B_i taken from
its threshold list at the daemon's active-request count (a counter the front end
publishes). Waiting never deadlocks, because it launches anyway when

    nothing else can arrive: every other engine is idle, or
    the oldest runnable request has waited max_wait.

The step_sync ablation (a global barrier between steps, what a lockstep runtime does)
is the `BarrierRule` subclass, chosen once at start, so the normal rule pays nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from trd.engines.spec import EngineSpec
from trd.ipc.counters import Counters

BARRIER_POLL_S = 50e-6


class Runnable(Protocol):
    runnable_since: float


def check_thresholds(thresholds: Sequence[int], max_wait_ms: float) -> None:
    if not thresholds or any(
        isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in thresholds
    ):
        raise ValueError(f"thresholds must be a non-empty list of ints >= 1, got {thresholds!r}")
    if not max_wait_ms >= 0:
        raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms!r}")


class LaunchRule:
    def __init__(self, spec: EngineSpec, counters: Counters | None) -> None:
        self.index = spec.index
        self.counters = counters
        self.thresholds: list[int] = [1]
        self.max_wait = 0.0
        self.set(spec.thresholds, spec.batching.max_wait_ms)
        self.held_since: float | None = None  # runnable work held back since then
        self.held_launches = 0  # launches that waited for a batch to fill
        self.held_seconds = 0.0

    def set(self, thresholds: Sequence[int], max_wait_ms: float) -> None:
        check_thresholds(thresholds, max_wait_ms)
        self.thresholds, self.max_wait = list(thresholds), max_wait_ms / 1e3

    def delay(self, now: float, runnable: Sequence[Runnable]) -> float:
        """0 when a forward should launch now; else seconds until it must (inf: idle)."""
        delay = self._delay(now, runnable)
        if delay > 0 and runnable and self.held_since is None:
            self.held_since = now
        elif delay == 0 and self.held_since is not None:
            self.held_launches += 1
            self.held_seconds += now - self.held_since
            self.held_since = None
        return delay

    def _delay(self, now: float, runnable: Sequence[Runnable]) -> float:
        if not runnable:
            return float("inf")
        c = self.counters
        active = c.active if c is not None else len(runnable)
        need = self.thresholds[min(max(active, 1), len(self.thresholds)) - 1]
        if len(runnable) >= need or c is None or c.others_idle(self.index):
            return 0.0  # enough work, or nothing else can arrive: waiting would deadlock
        waited = now - min(r.runnable_since for r in runnable)
        return max(0.0, self.max_wait - waited)

    def publish(self, runnable: int) -> None:
        """Tell the peers how many requests this engine has runnable (0 = idle)."""
        if self.counters is not None:
            self.counters.set_busy(self.index, runnable)

    def stepped(self) -> None:
        """A forward finished."""


class BarrierRule(LaunchRule):
    """step_sync ablation: forward k+1 waits until every busy peer finished forward k."""

    def __init__(self, spec: EngineSpec, counters: Counters) -> None:
        super().__init__(spec, counters)
        self.counters: Counters = counters
        self.num_models = spec.num_models
        self.completed = 0
        self.was_idle = True

    def _delay(self, now: float, runnable: Sequence[Runnable]) -> float:
        if runnable and self._behind():
            return BARRIER_POLL_S
        return super()._delay(now, runnable)

    def _behind(self) -> bool:
        c = self.counters
        peers = [j for j in range(self.num_models) if j != self.index and c.busy(j) > 0]
        if self.was_idle:
            # Joining after idling: skip the global steps this engine had no work in.
            self.completed = max([self.completed, *(c.steps(j) for j in peers)])
            c.set_steps(self.index, self.completed)
            self.was_idle = False
        return any(c.steps(j) < self.completed for j in peers)

    def publish(self, runnable: int) -> None:
        super().publish(runnable)
        self.was_idle = self.was_idle or runnable == 0

    def stepped(self) -> None:
        self.completed += 1
        self.counters.set_steps(self.index, self.completed)


def make_launch_rule(spec: EngineSpec, counters: Counters | None) -> LaunchRule:
    if spec.settings.step_sync and counters is not None:
        return BarrierRule(spec, counters)
    return LaunchRule(spec, counters)
