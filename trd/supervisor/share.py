"""Holding the large model's share of committed tokens at a target by moving a threshold.

With `policy: {..., target_large_share: s}` the daemon reads, every TICK_S, the engines'
counters of committed tokens (their Stats): the large (last) model's share of the n
tokens committed since the last measurement is the new one, once n >= MIN_TOKENS:

    e = measured - target            |e| within the noise, max(DEADBAND, the binomial
                                     deviation sqrt(t (1 - t) / n)): hold
    direction: the one that lowers the share when e > 0 (a policy's ThresholdScale
               says which way its threshold moves the share)
    step:      x1.5 while e keeps its sign, x0.5 when it flips (Rprop: the size adapts
               to how steeply the share answers, which differs by policy and workload),
               within [MIN_STEP, MAX_STEP] of the threshold's range
    tau = clamp(tau +- step * min(1, |e| / FULL_STEP_ERROR), low, high)

The deadband and the error-scaled move keep sampling noise from walking the threshold:
on a simulated share curve as steep as R-Stitch's on the fixtures, with binomial noise,
the share stays within 3 points of the target (tests/test_share_control.py).

Bounded (the range, the step), logged (each move with what was measured), off unless
`target_large_share` is set. Counters that go down mean the engines restarted: the
measurement starts over. Pure logic; the admin app runs the loop (trd/frontend/admin.py).
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
DEADBAND = 0.01
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
    base: tuple[int, int] | None = None  # (large, all) counters when it last moved
    moves: int = 0
    history: deque[tuple[float, int, int]] = field(default_factory=deque)

    def observe(self, now: float, stats: list[dict[str, Any]]) -> float | None:
        """The engines' latest Stats, in model order; returns a new threshold to install."""
        if len(stats) < 2 or any("tokens_committed" not in s for s in stats):
            return None
        if self.tau is None:
            reported = stats[0].get("policy_threshold")
            if reported is None:
                return None
            self.tau = float(reported)
        large = int(stats[-1]["tokens_committed"])
        total = sum(int(s["tokens_committed"]) for s in stats)
        self._remember(now, large, total)
        if self.base is None or total < self.base[1] or large < self.base[0]:
            self.base = (large, total)  # the first look, or the engines restarted
            return None
        done = total - self.base[1]
        if done < MIN_TOKENS:
            return None
        share = (large - self.base[0]) / done
        self.base = (large, total)
        error = share - self.target
        noise = math.sqrt(self.target * (1 - self.target) / done)
        if abs(error) <= max(DEADBAND, noise):
            self.sign = 0
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
