"""Holding the large model's share of committed tokens at a target by moving a threshold.

With `policy: {..., target_large_share: s}` the daemon reads, every TICK_S, the engines'
counters of committed tokens (their Stats), less those of requests with their own routing
(`routing` in the request: a threshold, share or model of its own, which the daemon's
threshold does not decide). A measurement window starts once each move
is in force (below); the large (last) model's share of the n tokens committed since is
the measured share, once n >= MIN_TOKENS:

    e = measured - target            |e| within the noise, max(DEADBAND, NOISE_Z times
                                     the sampling deviation of a window of n tokens): hold,
                                     and let the window grow (up to MAX_WINDOW_TOKENS, then
                                     start over)
    direction: the one that lowers the share when e > 0 (a policy's ThresholdScale
               says which way its threshold moves the share)
    step:      x1.5 while e keeps its sign, x0.5 when it flips (Rprop: the size adapts
               to how steeply the share answers, which differs by policy and workload),
               within [MIN_STEP, MAX_STEP] of the threshold's range
    tau = clamp(tau +- step * min(1, |e| / FULL_STEP_ERROR), low, high)

A window starts only once the move is in force: at the first look whose entry-engine
Stats report the new threshold. Engines send Stats every half second, so a window begun at
the move would hold up to a tick of tokens routed under the old threshold; with a window
of one tick (the daemon commits thousands of tokens a second) the error keeps its sign a
move too long, the step grows on it, and the threshold swings in a limit cycle (seen: a
60 s cycle 0.72 -> 0.94 -> 0.72 on the fixtures, where 0.835 held the target).

The sampling deviation is the binomial one inflated for runs: a request stays with the
large model for several tokens, so tokens are not independent draws. As a two-state
chain with mean runs m_L (large tokens per visit to the large model) and m_S, the
variance of a window's share is t (1 - t) / n times (1 + l) / (1 - l), l = 1 - 1/m_L -
1/m_S. A window that keeps growing while the share is near the target makes a small
persistent offset significant in time, and noise alone rarely moves the threshold.

Bounded (the range, the step), logged (each move with what was measured), off unless
`target_large_share` is set. Counters that go down mean the engines restarted: the
measurement starts over. Pure logic; the daemon's controllers run the loop
(trd/supervisor/control.py).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from trd.policies.params import ThresholdScale

log = logging.getLogger("trd.share")

TICK_S = 1.0
MIN_TOKENS = 512  # committed tokens per measurement: the share of fewer is too noisy
MAX_WINDOW_TOKENS = 16384  # a window near the target this long starts over (workloads drift)
DEADBAND = 0.01
NOISE_Z = 3.0  # deviations of sampling noise an error must exceed to move the threshold
FULL_STEP_ERROR = 0.1  # a smaller error moves the threshold proportionally less
FIRST_STEP, MIN_STEP, MAX_STEP = 0.05, 0.001, 0.1  # fractions of the threshold's range
STATUS_WINDOW_S = 10.0


@dataclass
class ShareControl:
    target: float
    scale: ThresholdScale
    tau: float | None = None  # None until the entry engine reports its threshold
    step: float = FIRST_STEP
    sign: int = 0  # of the last error acted on
    base: tuple[int, int, int] | None = None  # (large, all, visits) when the window began
    moves: int = 0
    history: deque[tuple[float, int, int]] = field(default_factory=deque)

    def observe(self, now: float, stats: list[dict[str, Any]]) -> float | None:
        """The engines' latest Stats, in model order; returns a new threshold to install."""
        if (
            len(stats) < 2
            or any("tokens_committed" not in s for s in stats)
            or "handoffs_in" not in stats[-1]
        ):
            return None
        reported = stats[0].get("policy_threshold")
        if self.tau is None:
            if reported is None:
                return None
            self.tau = float(reported)
        large = routed(stats[-1], "tokens_committed")
        visits = routed(stats[-1], "handoffs_in")
        total = sum(routed(s, "tokens_committed") for s in stats)
        self._remember(now, large, total)
        now_counts = (large, total, visits)
        if self.base is None and (reported is None or float(reported) != self.tau):
            return None  # the move is not in force yet (a restarted engine starts with it)
        if self.base is None or any(n < b for n, b in zip(now_counts, self.base, strict=True)):
            self.base = now_counts  # the first look, the move in force, or a restart
            return None
        done = total - self.base[1]
        if done < MIN_TOKENS:
            return None
        in_large = large - self.base[0]
        share = in_large / done
        error = share - self.target
        noise = window_noise(self.target, done, in_large, visits - self.base[2])
        if abs(error) <= max(DEADBAND, NOISE_Z * noise):
            if done >= MAX_WINDOW_TOKENS:
                self.base = now_counts
            return None
        sign = 1 if error > 0 else -1
        if self.sign:
            self.step = self.step * 1.5 if sign == self.sign else self.step / 2
        self.step = min(MAX_STEP, max(MIN_STEP, self.step))
        self.sign = sign
        lo, hi = self.scale.low, self.scale.high
        toward_less = -1 if self.scale.raises_share else 1
        old = self.tau
        move = self.step * min(1.0, abs(error) / FULL_STEP_ERROR) * (hi - lo)
        self.tau = min(hi, max(lo, old + sign * toward_less * move))
        self.moves += 1
        self.base = None  # the next window begins once the entry engine reports the move
        log.info("large share %.3f over %d tokens (target %.3f): threshold %.6g -> %.6g",
                 share, done, self.target, old, self.tau)  # fmt: skip
        return self.tau

    def _remember(self, now: float, large: int, total: int) -> None:
        if self.history and total < self.history[-1][2]:
            self.history.clear()  # restarted counters
        self.history.append((now, large, total))
        while now - self.history[0][0] > STATUS_WINDOW_S:
            self.history.popleft()

    def view(self) -> dict[str, Any]:
        """What `trctl status` shows: target, measured share (last STATUS_WINDOW_S), threshold."""
        measured = None
        if len(self.history) >= 2:
            (_, l0, t0), (_, l1, t1) = self.history[0], self.history[-1]
            measured = (l1 - l0) / (t1 - t0) if t1 > t0 else None
        return {"target": self.target, "measured": measured, "threshold": self.tau,
                "moves": self.moves, "window_s": STATUS_WINDOW_S}  # fmt: skip


def routed(stats: dict[str, Any], key: str) -> int:
    """An engine's counter `key`, less its part for requests with their own routing."""
    return int(stats[key]) - int(stats.get(f"{key}_own", 0))


def window_noise(target: float, done: int, in_large: int, visits: int) -> float:
    """The deviation of the share of `done` tokens at the target, given the window's runs:
    `in_large` of them by the large model over `visits` visits to it (module docstring)."""
    inflation = 2 * in_large * (done - in_large) / (max(1, visits) * done) - 1
    return math.sqrt(target * (1 - target) * max(1.0, inflation) / done)
