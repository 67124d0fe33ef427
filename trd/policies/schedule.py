"""Policies where the owner of every output position is known in advance.

`scripted` cycles through a fixed list of model indices (for tests: handoffs at any
position, first and last included). `ensemble` draws each position's model from fixed
ensemble weights with a counter-based random number of (seed, prompt, position), so the
draw is the same on every engine and in the reference loop (three or more models).

At model m with a candidate for output position p: if p is not m's, the candidate is
dropped and the owner regenerates p; otherwise it is kept and the request moves to the
owner of p + 1.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from trd.engines.request import Request
from trd.engines.sampler import uniform
from trd.policies.base import PolicyContext, Route, RoutingPolicy, StepView


class OwnerSchedulePolicy(RoutingPolicy):
    def owner(self, req: Request, position: int) -> int:
        raise NotImplementedError

    def route(self, reqs: Sequence[Request], step: StepView) -> list[Route]:
        m = self.ctx.model
        routes = []
        for req in reqs:
            p = req.num_output
            owner = self.owner(req, p)
            routes.append(
                Route(owner, False) if owner != m else Route(self.owner(req, p + 1), True)
            )
        return routes


class ScriptedPolicy(OwnerSchedulePolicy):
    name = "scripted"

    def __init__(self, ctx: PolicyContext, schedule: Sequence[int] = (0,), **rest: Any) -> None:
        super().__init__(ctx, **rest)
        sched = list(schedule)
        if not sched or any(not isinstance(s, int) or not 0 <= s < ctx.num_models for s in sched):
            raise ValueError(
                f"policy 'scripted': schedule must list model indices in [0, {ctx.num_models}), "
                f"got {schedule!r}"
            )
        self.schedule = sched

    def owner(self, req: Request, position: int) -> int:
        return self.schedule[position % len(self.schedule)]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "schedule": self.schedule}


class EnsemblePolicy(OwnerSchedulePolicy):
    name = "ensemble"

    def __init__(
        self, ctx: PolicyContext, weights: Sequence[float] = (), seed: int = 0, **rest: Any
    ) -> None:
        super().__init__(ctx, **rest)
        w = np.asarray(list(weights), dtype=np.float64)
        if w.shape != (ctx.num_models,) or (w < 0).any() or w.sum() <= 0:
            raise ValueError(
                f"policy 'ensemble': weights must be {ctx.num_models} non-negative numbers "
                f"with a positive sum, got {list(weights)!r}"
            )
        self.weights = (w / w.sum()).tolist()
        self.cum = np.cumsum(w / w.sum())
        self.seed = int(seed)

    def owner(self, req: Request, position: int) -> int:
        key = self.seed ^ zlib.crc32(np.asarray(req.seq[: req.prompt_len], np.int32).tobytes())
        u = uniform(key, position)
        return min(int(np.searchsorted(self.cum, u, side="right")), self.ctx.last)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "weights": self.weights, "seed": self.seed}
