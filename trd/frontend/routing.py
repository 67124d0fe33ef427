"""A request's own routing and priority, checked against what this daemon serves.

    "routing": {"large_share": 0.25}   the last model writes about this share of the
                                       request's output, held within the request
                                       (trd/policies/budget.py)
    "routing": {"threshold": 0.1}      the daemon's policy, with this threshold for this
                                       request only
    "routing": {"model": "large"}      this model writes every token, as if served alone
    "priority": -1                     vLLM's: lower first in every engine's queue

A request without `routing` (or with `"routing": {}`) gets the daemon's: its policy as
configured; with `policy.request_large_share: s`, `{"large_share": s}` (`tokenrouterd
--demo --request-share s`); with `policy.request_model: NAME`, `{"model": NAME}` (`--demo`:
the large model, verifying the small one's proposals: trd/engines/speculate.py).

The schema (trd/frontend/schema.py: Routing, RoutingFields) checks the types and the ranges
that hold everywhere; here what depends on the daemon: whether its policy has a threshold
to steer (trd/policies/params.py: THRESHOLDS; scripted and ensemble have none), that
threshold's scale, and the served models' names. Every refusal is a 400 naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from trd.frontend.errors import bad, describe
from trd.frontend.schema import RoutingFields
from trd.policies.params import THRESHOLDS
from trd.protocol import NO_ROUTING, RoutingParams


@dataclass(frozen=True, slots=True)
class RoutingRules:
    policy: str  # the daemon's policy
    names: tuple[str, ...]  # the served models, entry first
    # A request's unless it asks: policy.request_large_share or policy.request_model.
    default: RoutingParams = NO_ROUTING

    def params(self, req: RoutingFields) -> RoutingParams:
        """The engines' RoutingParams for `req`'s `routing`; ApiError (400) naming the key."""
        asked = req.routing
        default = self.default
        if asked is None:
            return default
        if asked.model is not None:
            if asked.model not in self.names:
                served = ", ".join(self.names)
                raise bad("routing.model", f"{describe(asked.model)} is not served ({served})")
            return RoutingParams(model=self.names.index(asked.model))
        key = "large_share" if asked.large_share is not None else "threshold"
        if asked.large_share is None and asked.threshold is None:
            return default  # "routing": {}
        scale = THRESHOLDS.get(self.policy)
        if scale is None:
            raise bad(f"routing.{key}", f"the policy {self.policy!r} has no threshold to steer "
                      "(use routing.model for one model)")  # fmt: skip
        if asked.threshold is not None and not scale.low <= asked.threshold <= scale.high:
            raise bad("routing.threshold", f"must be in [{scale.low:g}, {scale.high:.4g}] for "
                      f"{self.policy}, got {asked.threshold!r}")  # fmt: skip
        return RoutingParams(asked.large_share, asked.threshold)
