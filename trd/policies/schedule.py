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

import numpy as np

from trd.policies.base import PolicyContext, RequestView, Route, RoutingPolicy, StepView
from trd.policies.params import EnsembleParams, ScriptedParams
from trd.rng import uniform


class OwnerSchedulePolicy(RoutingPolicy):
    def owner(self, req: RequestView, position: int) -> int:
        raise NotImplementedError

    def route(self, reqs: Sequence[RequestView], step: StepView) -> list[Route]:
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

    def __init__(self, ctx: PolicyContext, params: ScriptedParams) -> None:
        super().__init__(ctx)
        self.schedule = params.schedule

    def owner(self, req: RequestView, position: int) -> int:
        return self.schedule[position % len(self.schedule)]


class EnsemblePolicy(OwnerSchedulePolicy):
    name = "ensemble"

    def __init__(self, ctx: PolicyContext, params: EnsembleParams) -> None:
        super().__init__(ctx)
        self.cum = np.cumsum(params.weights)
        self.seed = params.seed

    def owner(self, req: RequestView, position: int) -> int:
        if req.policy_state is None:  # the request's draw key, hashed once per engine
            prompt = np.asarray(req.seq[: req.prompt_len], np.int32).tobytes()
            req.policy_state = self.seed ^ zlib.crc32(prompt)
        u = uniform(req.policy_state, position)
        return min(int(np.searchsorted(self.cum, u, side="right")), self.ctx.last)
