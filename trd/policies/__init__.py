"""Routing policies, looked up by name."""

from __future__ import annotations

from typing import Any

from trd.policies.base import PolicyContext, Route, RoutingPolicy, StepView
from trd.policies.gated import CiterPolicy, CoLLMPolicy, R2RPolicy
from trd.policies.rstitch import RStitchPolicy
from trd.policies.schedule import EnsemblePolicy, ScriptedPolicy

POLICIES: dict[str, type[RoutingPolicy]] = {
    cls.name: cls
    for cls in (RStitchPolicy, CiterPolicy, R2RPolicy, CoLLMPolicy, EnsemblePolicy, ScriptedPolicy)
}

__all__ = ["POLICIES", "PolicyContext", "Route", "RoutingPolicy", "StepView", "make_policy"]


def make_policy(name: str, ctx: PolicyContext, params: dict[str, Any]) -> RoutingPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r} (choose from {sorted(POLICIES)})")
    return POLICIES[name](ctx, **params)
