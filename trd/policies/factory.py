"""Policies by name."""

from __future__ import annotations

from trd.policies.base import PolicyContext, RoutingPolicy
from trd.policies.gated import CiterPolicy, CoLLMPolicy, R2RPolicy
from trd.policies.glimp import GlimpPolicy
from trd.policies.params import PolicySpec, parse_policy
from trd.policies.rstitch import RStitchPolicy
from trd.policies.schedule import EnsemblePolicy, ScriptedPolicy

POLICIES: dict[str, type[RoutingPolicy]] = {
    cls.name: cls
    for cls in (
        RStitchPolicy,
        CiterPolicy,
        R2RPolicy,
        CoLLMPolicy,
        GlimpPolicy,
        EnsemblePolicy,
        ScriptedPolicy,
    )
}


def make_policy(spec: PolicySpec, ctx: PolicyContext) -> RoutingPolicy:
    """The policy `spec` names, for the engine `ctx` describes; PolicyError if misconfigured."""
    params = parse_policy(spec.name, spec.params, ctx.num_models)
    return POLICIES[spec.name](ctx, params)  # type: ignore[call-arg]
