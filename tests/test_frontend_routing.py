"""A request's own `routing` and `priority` over HTTP: what reaches the engines, or a 400
naming the field (the engines replaced by the wire: frontend_wire.WireGroup)."""

from __future__ import annotations

from typing import Any

import pytest

from trd.frontend.tokens import PromptEncoder
from trd.policies.params import GLIMP_MAX_H
from trd.protocol import NO_ROUTING, PARAMS_LAYOUT, RoutingParams, int_range

from frontend_wire import assert_error, chat, completion, post

BODIES = (("/v1/completions", completion), ("/v1/chat/completions", chat))
LOW, HIGH = int_range(PARAMS_LAYOUT["priority"])

SERVED = [
    ({}, "rstitch", NO_ROUTING),
    ({"routing": None}, "rstitch", NO_ROUTING),
    ({"routing": {}}, "rstitch", NO_ROUTING),
    ({"routing": {"large_share": 0.25}}, "rstitch", RoutingParams(large_share=0.25)),
    ({"routing": {"large_share": 1e-9}}, "citer", RoutingParams(large_share=1e-9)),
    ({"routing": {"threshold": 0}}, "rstitch", RoutingParams(threshold=0.0)),
    ({"routing": {"threshold": 1}}, "r2r", RoutingParams(threshold=1.0)),
    ({"routing": {"threshold": GLIMP_MAX_H}}, "glimp", RoutingParams(threshold=GLIMP_MAX_H)),
    ({"routing": {"model": "large"}}, "rstitch", RoutingParams(model=1)),
    ({"routing": {"model": "small"}}, "scripted", RoutingParams(model=0)),
    ({"routing": {"model": "large", "threshold": None}}, "ensemble", RoutingParams(model=1)),
]


@pytest.mark.parametrize(("fields", "policy", "routing"), SERVED)
def test_routing_reaches_the_engines(
    encoder: PromptEncoder, fields: dict[str, Any], policy: str, routing: RoutingParams
) -> None:
    for path, body in BODIES:
        ans = post(encoder, path, body(**fields), policy=policy)
        assert ans.status == 200, ans.body
        assert ans.submits[0].params.routing == routing


# The daemon's default (policy.request_large_share 0.3, or request_model: large as
# `--demo` has it): what a request that asks nothing gets instead, and what asks wins
SHARED, PINNED = RoutingParams(large_share=0.3), RoutingParams(model=1)
DEFAULTED = [
    *((default, {}, default) for default in (SHARED, PINNED)),
    *((default, {"routing": None}, default) for default in (SHARED, PINNED)),
    *((default, {"routing": {}}, default) for default in (SHARED, PINNED)),
    *((default, {"routing": {"threshold": None}}, default) for default in (SHARED, PINNED)),
    (SHARED, {"routing": {"large_share": 0.05}}, RoutingParams(large_share=0.05)),
    (PINNED, {"routing": {"large_share": 0.3}}, RoutingParams(large_share=0.3)),
    (SHARED, {"routing": {"threshold": 0.1}}, RoutingParams(threshold=0.1)),
    (PINNED, {"routing": {"threshold": 0.1}}, RoutingParams(threshold=0.1)),
    (SHARED, {"routing": {"model": "small"}}, RoutingParams(model=0)),
    (PINNED, {"routing": {"model": "small"}}, RoutingParams(model=0)),
]


@pytest.mark.parametrize(("default", "fields", "routing"), DEFAULTED)
def test_the_daemon_s_default_routing_holds_unless_a_request_asks(
    encoder: PromptEncoder, default: RoutingParams, fields: dict[str, Any], routing: RoutingParams
) -> None:
    for path, body in BODIES:
        ans = post(encoder, path, body(**fields), default=default)
        assert ans.status == 200, ans.body
        assert ans.submits[0].params.routing == routing


@pytest.mark.parametrize("priority", [None, LOW, -1, 0, 7, HIGH])
def test_priority_reaches_the_engines(encoder: PromptEncoder, priority: int | None) -> None:
    for path, body in BODIES:
        ans = post(encoder, path, body(priority=priority, n=2))
        assert ans.status == 200, ans.body
        assert [s.params.priority for s in ans.submits] == [priority or 0] * 2


REFUSED = [
    ({"priority": LOW - 1}, "rstitch", "priority", "greater than or equal to -2147483648"),
    ({"priority": HIGH + 1}, "rstitch", "priority", "less than or equal to 2147483647"),
    ({"priority": 1.0}, "rstitch", "priority", "valid integer"),
    ({"priority": "1"}, "rstitch", "priority", "valid integer"),
    ({"routing": 0.25}, "rstitch", "routing", "valid dictionary"),
    ({"routing": {"large_share": 0}}, "rstitch", "routing.large_share", "greater than 0"),
    ({"routing": {"large_share": 1}}, "rstitch", "routing.large_share", "less than 1"),
    ({"routing": {"large_share": "0.2"}}, "rstitch", "routing.large_share", "valid number"),
    ({"routing": {"threshold": -0.1}}, "rstitch", "routing.threshold", "greater than or equal"),
    ({"routing": {"threshold": 1.5}}, "rstitch", "routing.threshold", "[0, 1] for rstitch"),
    ({"routing": {"threshold": 3.0}}, "glimp", "routing.threshold", "[0, 2.996] for glimp"),
    ({"routing": {"threshold": 0.1}}, "scripted", "routing.threshold", "no threshold to steer"),
    ({"routing": {"large_share": 0.3}}, "ensemble", "routing.large_share", "'ensemble' has no"),
    ({"routing": {"model": "huge"}}, "rstitch", "routing.model", '"huge" is not served (small'),
    ({"routing": {"model": 1}}, "rstitch", "routing.model", "valid string"),
    ({"routing": {"large_shar": 0.2}}, "rstitch", "routing.large_shar", "Extra inputs"),
    (
        {"routing": {"large_share": 0.2, "model": "large"}},
        "rstitch",
        "routing",
        "takes one of large_share, threshold and model, got large_share and model",
    ),
]


@pytest.mark.parametrize(("fields", "policy", "param", "part"), REFUSED)
def test_bad_routing_and_priority_are_400s_naming_the_field(
    encoder: PromptEncoder, fields: dict[str, Any], policy: str, param: str, part: str
) -> None:
    for path, body in BODIES:
        ans = post(encoder, path, body(**fields), policy=policy)
        assert_error(ans, 400, param)
        assert part in ans.body["error"]["message"], ans.body
