"""A request's own routing in the engines: its own threshold, its own large-model share
held within it, or one model for every token.

The engines are wired in one process (trd.testing.wiring: the real codec, chosen
interleavings, duplicated and reordered messages) and must give the float64 reference
loop's tokens and producers exactly, at 1, 4 and all requests in flight, with requests
of every kind mixed in one batch; a pinned request must give the model's own output; a
256-token request must land near its share with no other traffic.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trd.engines.engine import Engine
from trd.protocol import RoutingParams, SamplingParams
from trd.testing.wiring import Job, assert_matches

from routing_cases import GLIMP, MODEL_SETS, jobs, prompts, reference, specs, wired

CASES = [("rstitch", {"threshold": 0.78}, 2), ("rstitch", {"threshold": 0.78}, 3),
         ("glimp", GLIMP, 2)]  # fmt: skip


def own_routing(n_models: int, share: float, threshold: float) -> list[RoutingParams]:
    """One of each kind, the daemon's routing among them."""
    return [
        RoutingParams(large_share=share),
        RoutingParams(),
        RoutingParams(threshold=threshold),
        RoutingParams(model=n_models - 1),
        RoutingParams(large_share=share / 2),
        RoutingParams(model=0),
    ]


def mixed(work: list[Job], routings: list[RoutingParams]) -> list[Job]:
    return [
        (prompt, dataclasses.replace(p, routing=routings[i % len(routings)]))
        for i, (prompt, p) in enumerate(work)
    ]


@pytest.mark.parametrize("policy,params,n_models", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_own_routing_matches_the_reference_at_every_concurrency(
    tiny_models: dict[str, Path], policy: str, params: dict, n_models: int
) -> None:
    paths = [tiny_models[n] for n in MODEL_SETS[n_models]]
    # Thresholds that route differently from the daemon's, on each policy's scale
    routings = own_routing(n_models, 0.4, 0.9 if policy == "rstitch" else 2.95)
    work = mixed(jobs(paths[0])[2:10], routings)
    expected = reference(paths, policy, params, work)
    for concurrency in (1, 4, 0):
        wiring = wired(paths, policy, params, seed=30 * n_models + concurrency)
        wiring.run(work, concurrency)
        assert_matches(wiring, expected)
    last = n_models - 1
    for (_, p), trace in zip(work, expected, strict=True):
        if p.routing.model is not None:
            assert set(trace.models) == {p.routing.model}
    shared = [t for (_, p), t in zip(work, expected, strict=True) if p.routing.large_share]
    assert any(last in t.models and 0 in t.models for t in shared)  # the share did route


def test_a_pinned_request_gets_its_model_s_own_output(tiny_models: dict[str, Path]) -> None:
    """routing.model: the tokens of that model served alone (greedy and seeded samples),
    with requests of the daemon's routing beside it, and no work on the other model."""
    paths = [tiny_models[n] for n in MODEL_SETS[2]]
    work = jobs(paths[0])[2:10]
    policy = {"threshold": 0.78}
    for model in (1, 0):
        pinned = [(prompt, dataclasses.replace(p, routing=RoutingParams(model=model)))
                  for prompt, p in work]  # fmt: skip
        wiring = wired(paths, "rstitch", policy, seed=model)
        got = wiring.run([*pinned, *work[:3]])[: len(pinned)]
        alone = Engine(specs(paths, "rstitch", policy)[model])
        for (prompt, p), gen in zip(pinned, got, strict=True):
            want = alone.generate([prompt], p)[0]
            assert gen.tokens == want and set(gen.models) == {model}
            assert set(gen.dones) == {model}  # only that engine held it
        assert wiring.engines[1 - model].stats.tokens_committed > 0  # the others routed


LONG = 256


def landed(paths: list[Path], share: float, count: int) -> list[float]:
    """The large shares of `count` 256-token requests (R-Stitch at a threshold that gives
    another share), each held within itself: nothing else to learn from (the batch's
    other requests hold their own)."""
    routing = RoutingParams(large_share=share)
    params = SamplingParams(max_tokens=LONG, ignore_eos=True, routing=routing)
    work = [(p, params) for p in prompts(paths[0], 40)[4 : 4 + 4 * count : 4]]
    wiring = wired(paths, "rstitch", {"threshold": 0.78}, seed=None)
    return [g.models.count(1) / LONG for g in wiring.run(work)]


@pytest.mark.parametrize("share", [0.1, 0.3])
def test_a_256_token_request_lands_near_its_share(
    tiny_models: dict[str, Path], share: float
) -> None:
    shares = landed([tiny_models[n] for n in MODEL_SETS[2]], share, count=2)
    assert all(abs(s - share) <= 0.02 for s in shares), shares


@pytest.mark.slow
@pytest.mark.parametrize("share", [0.1, 0.2, 0.3])
def test_256_token_requests_land_near_their_share_on_nine_prompts(
    tiny_models: dict[str, Path], share: float
) -> None:
    shares = landed([tiny_models[n] for n in MODEL_SETS[2]], share, count=9)
    assert all(abs(s - share) <= 0.02 for s in shares), shares
