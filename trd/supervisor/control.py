"""The daemon's controllers: tasks that read the engines' statistics and steer them,
started by the daemon once the engines serve and stopped before they are.

    rates       every SAMPLE_EVERY_S: tokens/s and handoffs/s per engine (rates.py)
    share       with `policy.target_large_share`: every TICK_S, ShareControl (share.py)
                moves the policy's threshold toward the target
    autotuner   with `batching.auto_interval_s` > 0: on that interval, the Markov model's
                best delayed-batching thresholds from live measurements
                (trd/batching/live.py), applied and logged when they change

The admin API (trd/frontend/admin.py) only reads them (rates, the share's view, a
recommendation) and sets thresholds through the keeper.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from trd.batching.live import recommend_live
from trd.policies.params import THRESHOLDS, target_share
from trd.supervisor.keeper import EngineKeeper
from trd.supervisor.rates import Rates
from trd.supervisor.share import TICK_S, ShareControl

log = logging.getLogger("trd.control")

SAMPLE_EVERY_S = 1.0


class NotReady(Exception):
    """A recommendation cannot be made yet; the message says why."""


class NoStatistics(NotReady):
    """Not every engine has reported statistics yet."""


class TooFewMeasurements(NotReady):
    """The engines' live measurements do not yet determine the model."""


class Controllers:
    def __init__(self, keeper: EngineKeeper) -> None:
        self.keeper = keeper
        self.rates = Rates()
        policy = keeper.cfg.policy
        target = target_share(policy)
        self.share = None if target is None else ShareControl(target, THRESHOLDS[policy.name])
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loops: list[Callable[[], Coroutine[Any, Any, None]]] = [self._sample]
        if self.keeper.cfg.batching.auto_interval_s > 0:
            loops.append(self._autotune)
        if self.share is not None:
            loops.append(self._hold_share)
        self.tasks = [asyncio.get_running_loop().create_task(loop()) for loop in loops]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.tasks = []

    async def recommendation(self) -> dict[str, Any]:
        """The Markov model's best thresholds from the engines' live measurements, per
        model index ("table") and name ("models"); NotReady when it cannot say yet."""
        stats = self.keeper.engine_stats()
        specs = self.keeper.specs
        by_index = {s.index: stats[s.name] for s in specs if s.name in stats}
        if len(by_index) < len(specs):
            raise NoStatistics("not every engine has reported statistics yet")
        try:
            # The solver is CPU-bound: keep it off the event loop.
            out = await asyncio.get_running_loop().run_in_executor(None, recommend_live, by_index)
        except ValueError as exc:
            raise TooFewMeasurements(f"not enough live measurements yet: {exc}") from None
        out["models"] = {s.name: out["table"][s.index] for s in specs}
        return out

    async def _sample(self) -> None:
        while True:
            self.rates.sample(self.keeper.engine_stats(), time.monotonic())
            await asyncio.sleep(SAMPLE_EVERY_S)

    async def _autotune(self) -> None:
        while True:
            await asyncio.sleep(self.keeper.cfg.batching.auto_interval_s)
            try:
                rec = await self.recommendation()
            except NotReady as exc:
                log.info("thresholds auto: skipped (%s)", exc)
                continue
            wanted = {name: tuple(t) for name, t in rec["models"].items()}
            current = {s.name: s.thresholds for s in self.keeper.specs}
            if wanted != current:
                log.info("thresholds auto: %s -> %s", current, wanted)
                self.keeper.set_thresholds(wanted, self.keeper.specs[0].batching.max_wait_ms)

    async def _hold_share(self) -> None:
        share = self.share
        assert share is not None
        while True:
            await asyncio.sleep(TICK_S)
            stats = self.keeper.engine_stats()
            names = [s.name for s in self.keeper.specs]
            ordered = [stats[n] for n in names] if set(names) <= set(stats) else []
            tau = share.observe(time.monotonic(), ordered)
            if tau is not None:
                self.keeper.set_policy_threshold(tau)
