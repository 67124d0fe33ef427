"""R-Stitch: entropy-gated escalation (training-free).

Normalised entropy H of model m's next-token distribution:
  - on a model below the last, H > tau: drop the candidate, the next model regenerates;
  - on a model above the first, H <= tau: keep the candidate and return to model 0;
  - otherwise keep the candidate and stay.
With two models this is R-Stitch exactly: the small model hands uncertain positions to
the large one, which keeps the request until it is confident itself. A request with its
own large_share also leaves the last model once its budget allows no more large tokens
(trd/policies/budget.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trd.policies.base import (
    PolicyContext,
    RequestView,
    RouteBatch,
    StepView,
    ThresholdPolicy,
    normalized_entropy,
)
from trd.policies.params import RStitchParams


class RStitchPolicy(ThresholdPolicy):
    name = "rstitch"

    def __init__(self, ctx: PolicyContext, params: RStitchParams) -> None:
        super().__init__(ctx)
        self.tau = params.threshold

    def route(self, reqs: Sequence[RequestView], step: StepView) -> RouteBatch:
        m, last = self.ctx.model, self.ctx.last
        h = normalized_entropy(step.logits)
        unsure = h > self.taus(reqs, h)
        dst = torch.full_like(h, m, dtype=torch.long)
        if m < last:
            dst = torch.where(unsure, m + 1, dst)
        if m > 0:
            allowed = self.may_stay(reqs, h) if m == last else None
            stay = unsure if allowed is None else unsure & allowed
            dst = torch.where(~stay, 0, dst)
        commit = ~unsure if m < last else torch.ones_like(unsure)
        self.record(reqs, h)
        return RouteBatch(dst, commit)
