"""Policy construction errors and decisions on hand-made logits (no model needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trd.engines.request import Request
from trd.policies import PolicyContext, StepView, make_policy
from trd.policies.heads import save_random_head
from trd.protocol import SamplingParams

HIDDEN = 8


def ctx(model: int, num_models: int = 2) -> PolicyContext:
    return PolicyContext(model, num_models, torch.nn.Embedding(16, HIDDEN))


def req(num_output: int = 0) -> Request:
    return Request(1, [3, 4] + [5] * num_output, 2, SamplingParams(), 0.0)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("nope", {}, "unknown policy 'nope'"),
        ("rstitch", {"threshold": 1.5}, r"threshold must be a number in \[0.0, 1.0\]"),
        ("rstitch", {"tau": 0.5}, r"unknown parameters \['tau'\]"),
        ("scripted", {"schedule": [0, 2]}, r"schedule must list model indices in \[0, 2\)"),
        ("ensemble", {"weights": [1.0]}, "weights must be 2 non-negative numbers"),
        ("citer", {"head": "/nonexistent.safetensors"}, "cannot read safetensors"),
    ],
)
def test_bad_policy_settings_are_named(name: str, params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_policy(name, ctx(0), params)


def test_router_head_of_the_wrong_size_is_rejected(tmp_path: Path) -> None:
    path = save_random_head(tmp_path / "h.safetensors", "citer", HIDDEN + 2, 4, seed=0)
    with pytest.raises(ValueError, match=r"takes 10 inputs, this model gives 8"):
        make_policy("citer", ctx(0), {"head": str(path)})
    ok = save_random_head(tmp_path / "r2r.safetensors", "r2r", 2 * HIDDEN + 3, 4, seed=0, top_k=3)
    make_policy("r2r", ctx(0), {"head": str(ok)})


def test_rstitch_escalates_uncertain_positions_and_returns_when_sure() -> None:
    sure = torch.tensor([[10.0, 0.0, 0.0, 0.0]])
    unsure = torch.zeros(1, 4)  # uniform: normalised entropy 1
    small, large = (
        make_policy("rstitch", ctx(0), {"threshold": 0.5}),
        make_policy("rstitch", ctx(1), {"threshold": 0.5}),
    )

    def view(logits: torch.Tensor) -> StepView:
        return StepView(logits, torch.zeros(1, HIDDEN), [0])

    (r,) = small.route([req()], view(unsure))
    assert (r.dst, r.commit) == (1, False)  # drop the candidate, the large model regenerates
    (r,) = small.route([req()], view(sure))
    assert (r.dst, r.commit) == (0, True)
    (r,) = large.route([req()], view(unsure))
    assert (r.dst, r.commit) == (1, True)  # the large model keeps it while unsure
    (r,) = large.route([req()], view(sure))
    assert (r.dst, r.commit) == (0, True)  # and returns it once confident


def test_scripted_hands_the_first_and_later_positions_to_their_owner() -> None:
    small, large = (make_policy("scripted", ctx(m), {"schedule": [1, 0, 0]}) for m in (0, 1))
    view = StepView(torch.zeros(1, 4), torch.zeros(1, HIDDEN), [7])
    (r,) = small.route([req(0)], view)
    assert (r.dst, r.commit) == (1, False)  # position 0 is the large model's
    (r,) = large.route([req(0)], view)
    assert (r.dst, r.commit) == (0, True)  # keep it; position 1 is the small model's
    (r,) = small.route([req(2)], view)
    assert (r.dst, r.commit) == (1, True)  # keep position 2; position 3 is the large's
