"""Policy construction errors and decisions on hand-made logits (no model needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trd.engines.request import Request
from trd.policies.base import (
    PolicyContext,
    Route,
    RouteBatch,
    RoutingPolicy,
    StepView,
    host_routes,
    pinned,
)
from trd.policies.factory import make_policy
from trd.policies.heads import logit_features, save_head, save_random_head
from trd.policies.params import PolicyError, PolicySpec, parse_policy
from trd.protocol import RoutingParams, SamplingParams

HIDDEN = 8


def ctx(model: int, num_models: int = 2) -> PolicyContext:
    return PolicyContext(model, num_models, torch.nn.Embedding(16, HIDDEN))


def req(num_output: int = 0) -> Request:
    return Request(1, [3, 4] + [5] * num_output, 2, SamplingParams(), 0.0)


def make(name: str, context: PolicyContext, params: dict) -> RoutingPolicy:
    return make_policy(PolicySpec(name, params), context)


def route(policy: RoutingPolicy, reqs: list[Request], view: StepView) -> list[Route]:
    return host_routes(policy.route(reqs, view))


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("nope", {}, "policy.name: 'nope': unknown policy"),
        ("rstitch", {"threshold": 1.5}, r"policy.threshold: 1.5: expected a number in \[0, 1\]"),
        ("rstitch", {"threshold": True}, r"policy.threshold: True: expected a number"),
        ("rstitch", {"tau": 0.5}, "policy.tau: 0.5: unknown parameter of rstitch"),
        ("scripted", {"schedule": [0, 2]}, "policy.schedule: .*model indices < 2"),
        ("scripted", {"schedule": []}, "policy.schedule: .*non-empty"),
        ("ensemble", {"weights": [1.0]}, "policy.weights: .*expected 2 non-negative numbers"),
        ("ensemble", {"weights": [0, 0]}, "policy.weights: .*sum > 0"),
        ("ensemble", {"weights": [1, 1], "seed": -1}, "policy.seed: -1"),
        ("citer", {"head": "/nonexistent.safetensors"}, "policy.head: .*router head file"),
    ],
)
def test_bad_policy_settings_are_named_without_torch_work(
    name: str, params: dict, message: str
) -> None:
    """`--check` validates these before any engine starts (trd/policies/params.py)."""
    with pytest.raises(PolicyError, match=message):
        parse_policy(name, params, num_models=2)


def test_gated_policies_need_two_models(tmp_path: Path) -> None:
    path = save_random_head(tmp_path / "h.safetensors", "citer", HIDDEN, 4, seed=0)
    with pytest.raises(PolicyError, match="needs at least two models"):
        parse_policy("citer", {"head": str(path)}, num_models=1)


def test_router_head_of_the_wrong_size_is_rejected(tmp_path: Path) -> None:
    path = save_random_head(tmp_path / "h.safetensors", "citer", HIDDEN + 2, 4, seed=0)
    with pytest.raises(ValueError, match=r"takes 10 inputs, this model gives 8"):
        make("citer", ctx(0), {"head": str(path)})
    ok = save_random_head(tmp_path / "r2r.safetensors", "r2r", 2 * HIDDEN + 3, 4, seed=0, top_k=3)
    make("r2r", ctx(0), {"head": str(ok)})


def test_a_head_with_negative_top_k_is_refused_naming_it(tmp_path: Path) -> None:
    path = save_random_head(tmp_path / "h.safetensors", "citer", HIDDEN, 4, seed=0, top_k=-2)
    with pytest.raises(PolicyError, match=r"policy.head: .*metadata top_k -2: the number of"):
        make("citer", ctx(0), {"head": str(path)})


def test_a_head_with_top_k_reads_the_logits_features(tmp_path: Path) -> None:
    """collm over [h, top-2 log-probs, normalised entropy, top-20 entropy], weighted on the
    normalised entropy alone: the flat row defers, the peaked one does not, whatever h."""
    logits = torch.tensor([[10.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    feats = logit_features(logits, 2)
    assert feats.shape == (2, 4)
    assert torch.allclose(
        feats[1], torch.tensor([-1.3863, -1.3863, 1.0, 1.3863], dtype=torch.float64), atol=1e-4
    )
    w = torch.zeros(1, HIDDEN + 4)
    w[0, HIDDEN + 2] = 10.0
    path = save_head(tmp_path / "collm.safetensors", "collm", [(w, torch.tensor([-5.0]))], top_k=2)
    policy = make("collm", ctx(0), {"head": str(path), "threshold": 0.5})
    view = StepView(logits.float(), torch.randn(2, HIDDEN), torch.tensor([0, 1]))
    assert [r.dst for r in host_routes(policy.route([req(), req()], view))] == [0, 1]
    with pytest.raises(ValueError, match=r"takes 12 inputs, this model gives 8"):
        make(
            "collm",
            ctx(0),
            {"head": str(save_head(tmp_path / "c0.safetensors", "collm", [(w, torch.zeros(1))]))},
        )


def test_rstitch_escalates_uncertain_positions_and_returns_when_sure() -> None:
    sure = torch.tensor([[10.0, 0.0, 0.0, 0.0]])
    unsure = torch.zeros(1, 4)  # uniform: normalised entropy 1
    small, large = (
        make("rstitch", ctx(0), {"threshold": 0.5}),
        make("rstitch", ctx(1), {"threshold": 0.5}),
    )

    def view(logits: torch.Tensor) -> StepView:
        return StepView(logits, torch.zeros(1, HIDDEN), torch.tensor([0]))

    (r,) = route(small, [req()], view(unsure))
    assert (r.dst, r.commit) == (1, False)  # drop the candidate, the large model regenerates
    (r,) = route(small, [req()], view(sure))
    assert (r.dst, r.commit) == (0, True)
    (r,) = route(large, [req()], view(unsure))
    assert (r.dst, r.commit) == (1, True)  # the large model keeps it while unsure
    (r,) = route(large, [req()], view(sure))
    assert (r.dst, r.commit) == (0, True)  # and returns it once confident


def test_rstitch_decides_on_the_device_for_the_whole_batch() -> None:
    """R-Stitch returns tensors (copied to the host with the tokens, in the step's one
    copy) that hold the same decisions row by row."""
    logits = torch.tensor([[10.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 9.0, 0.0, 0.0]])
    view = StepView(logits, torch.zeros(3, HIDDEN), torch.tensor([0, 1, 1]))
    routes = make("rstitch", ctx(0), {"threshold": 0.5}).route([req(), req(), req()], view)
    assert isinstance(routes, RouteBatch) and routes.dst.device == logits.device
    assert [(r.dst, r.commit) for r in host_routes(routes)] == [(0, True), (1, False), (0, True)]


def test_scripted_hands_the_first_and_later_positions_to_their_owner() -> None:
    small, large = (make("scripted", ctx(m), {"schedule": [1, 0, 0]}) for m in (0, 1))
    view = StepView(torch.zeros(1, 4), torch.zeros(1, HIDDEN), torch.tensor([7]))
    (r,) = route(small, [req(0)], view)
    assert (r.dst, r.commit) == (1, False)  # position 0 is the large model's
    (r,) = route(large, [req(0)], view)
    assert (r.dst, r.commit) == (0, True)  # keep it; position 1 is the small model's
    (r,) = route(small, [req(2)], view)
    assert (r.dst, r.commit) == (1, True)  # keep position 2; position 3 is the large's


def routed(routing: RoutingParams, num_output: int = 0, large: int = 0) -> Request:
    r = Request(1, [3, 4] + [5] * num_output, 2, SamplingParams(routing=routing), 0.0)
    r.large_tokens = large
    return r


def test_a_request_s_own_threshold_decides_its_row_alone() -> None:
    """One batch, one logits row (normalised entropy 0.5) three times: the policy's
    threshold 0.3 escalates it, the rows at 0.6 keep it, on the small and the large model."""
    logits = torch.log(torch.tensor([[0.86, 0.14 / 3, 0.14 / 3, 0.14 / 3]] * 3)).double()
    view = StepView(logits, torch.zeros(3, HIDDEN), torch.tensor([0, 0, 0]))
    reqs = [req(), routed(RoutingParams(threshold=0.6)), routed(RoutingParams(threshold=0.6))]
    small, large = (make("rstitch", ctx(m), {"threshold": 0.3}) for m in (0, 1))
    assert [(r.dst, r.commit) for r in route(small, reqs, view)] == [
        (1, False),
        (0, True),
        (0, True),
    ]
    assert [(r.dst, r.commit) for r in route(large, reqs, view)] == [
        (1, True),
        (0, True),
        (0, True),
    ]


def test_a_large_share_escalates_the_least_certain_and_holds_the_budget() -> None:
    """The entry model compares each row with the request's quantile of its own scores
    (trd/policies/budget.py); the last model stays only while the budget allows."""
    small, large = (make("rstitch", ctx(m), {"threshold": 0.99}) for m in (0, 1))
    share = RoutingParams(large_share=0.25)
    r = routed(share, num_output=7, large=2)  # deficit 0.25 * 8 - 2 = 0: p = 0.25
    r.scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]  # tau = scores[ceil(6) - 1] = 0.6
    probs = torch.tensor([0.5, 0.5, 0.0, 0.0]) + 1e-12  # entropy 0.5: below 0.6
    flat = torch.zeros(1, 4)  # entropy 1: above it
    view = lambda x: StepView(x.double(), torch.zeros(1, HIDDEN), torch.tensor([0]))  # noqa: E731
    (got,) = route(small, [r], view(torch.log(probs)[None]))
    assert (got.dst, got.commit, r.share_tau) == (0, True, 0.6)
    assert len(r.scores) == 9  # its score kept
    (got,) = route(small, [r], view(flat))
    assert (got.dst, got.commit) == (1, False)
    assert r.scores[-1] == pytest.approx(1.0)
    # On the large model, unsure (entropy 1 > tau 0.6): it stays while one more large
    # token fits the share, 2 + 2 <= 0.25 * (N + 2), so at N = 14, not at N = 13.
    for made, dst in ((14, 1), (13, 0)):
        arrived = routed(share, made, 2)
        arrived.share_tau = 0.6  # as the handoff brings it
        (got,) = route(large, [arrived], view(flat))
        assert (got.dst, got.commit) == (dst, True)


def test_citer_s_large_share_escalates_low_confidence(tmp_path: Path) -> None:
    """CITER escalates when its confidence is below tau: the request's quantile is taken
    on the low side (scores kept negated, so a higher one is less certain)."""
    w = torch.zeros(1, HIDDEN)
    w[0, 0] = 1.0
    path = save_head(tmp_path / "c.safetensors", "citer", [(w, torch.zeros(1))])
    policy = make("citer", ctx(0), {"head": str(path), "threshold": 0.0})
    r = routed(RoutingParams(large_share=0.5))  # p = 0.5 + (0.5 - 0) / 4 = 0.625
    hidden = torch.tensor([[4.0] + [0.0] * (HIDDEN - 1), [-4.0] + [0.0] * (HIDDEN - 1)])
    r.scores = sorted((-torch.sigmoid(hidden[:, 0])).tolist())  # a sure and an unsure row seen
    view = StepView(torch.zeros(2, 4), hidden, torch.tensor([0, 0]))
    routes = route(policy, [r, r], view)
    assert [x.dst for x in routes] == [0, 1]  # the unsure one escalates


def test_pinned_requests_stay_on_their_model_whatever_the_policy_says() -> None:
    on_small = routed(RoutingParams(model=0))
    on_large = routed(RoutingParams(model=1))
    decided = [Route(1, False), Route(1, False), Route(0, True)]
    reqs = [req(), on_small, on_large]
    assert pinned(reqs, decided, 0) == [Route(1, False), Route(0, True), Route(1, False)]
    batch = RouteBatch(torch.tensor([1, 1, 0]), torch.tensor([False, False, True]))
    got = host_routes(pinned(reqs, batch, 0))
    assert got == [Route(1, False), Route(0, True), Route(1, False)]
    assert host_routes(pinned(reqs, batch, 1))[1:] == [Route(0, False), Route(1, True)]
