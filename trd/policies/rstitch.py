"""R-Stitch: entropy-gated escalation (training-free).

Normalised entropy H of model m's next-token distribution:
  - on a model below the last, H > tau: drop the candidate, the next model regenerates;
  - on a model above the first, H <= tau: keep the candidate and return to model 0;
  - otherwise keep the candidate and stay.
With two models this is R-Stitch exactly: the small model hands uncertain positions to
the large one, which keeps the request until it is confident itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trd.engines.request import Request
from trd.policies.base import (
    PolicyContext,
    Route,
    RoutingPolicy,
    StepView,
    check_threshold,
    normalized_entropy,
)


class RStitchPolicy(RoutingPolicy):
    name = "rstitch"

    def __init__(self, ctx: PolicyContext, threshold: float = 0.3, **rest: Any) -> None:
        super().__init__(ctx, **rest)
        self.tau = check_threshold(self.name, "threshold", threshold, 0.0, 1.0)

    def route(self, reqs: Sequence[Request], step: StepView) -> list[Route]:
        m, last = self.ctx.model, self.ctx.last
        h = normalized_entropy(step.logits)
        unsure = h > self.tau
        dst = torch.full_like(h, m, dtype=torch.long)
        if m < last:
            dst = torch.where(unsure, m + 1, dst)
        if m > 0:
            dst = torch.where(~unsure, 0, dst)
        commit = ~unsure if m < last else torch.ones_like(unsure)
        return [Route(d, c) for d, c in zip(dst.tolist(), commit.tolist(), strict=True)]

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "threshold": self.tau}
