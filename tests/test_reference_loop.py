"""The one reference loop (trd/testing/reference.py) in its two modes: the research-code
baseline the benchmarks and the GPU check time (a KV cache per model, caught up on
hand-back) gives the float64 oracle's exact trace (tokens, producers, finish, tokens fed
per model). Both decide with the reference's own rules (trd/testing/reference_rules.py),
which test_reference_rules.py checks against the policies' definitions."""

from __future__ import annotations

from pathlib import Path

import pytest

from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.testing.reference import ReferenceRouter

from routing_cases import GLIMP, jobs, reference

CASES = [("rstitch", {"threshold": 0.78}), ("scripted", {"schedule": [1, 0, 0, 1, 1, 0]}),
         ("glimp", GLIMP)]  # fmt: skip


@pytest.mark.parametrize("policy,params", CASES, ids=[c[0] for c in CASES])
def test_the_cached_loop_gives_the_oracles_trace(
    tiny_models: dict[str, Path], policy: str, params: dict
) -> None:
    paths = [tiny_models["small"], tiny_models["large"]]
    work = jobs(paths[0])[2:10]  # test_routing_inprocess's: the oracle's traces are shared
    expected = reference(paths, policy, params, work)
    cached = ReferenceRouter(paths, PolicySpec(policy, params), kv_cache=True)
    got = [cached.run(p, sp) for p, sp in work]
    for want, have in zip(expected, got, strict=True):
        assert (have.tokens, have.models, have.finish, have.fed) == (
            want.tokens, want.models, want.finish, want.fed,
        )  # fmt: skip
        assert 0 < have.ttft <= have.latency
    assert {m for t in got for m in t.models} == {0, 1}  # both models made tokens
    assert sum(t.forwards for t in got) == sum(t.forwards for t in expected)


def test_min_tokens_holds_back_stops_in_the_cached_loop(tiny_models: dict[str, Path]) -> None:
    """The early-stop ban the old baseline loop skipped: no stop id before min_tokens."""
    paths = [tiny_models["small"], tiny_models["large"]]
    loop = ReferenceRouter(paths, PolicySpec("rstitch", {"threshold": 0.78}), kv_cache=True)
    prompt = jobs(paths[0])[3][0]
    stop = loop.run(prompt, SamplingParams(max_tokens=8)).tokens[2]
    free = loop.run(prompt, SamplingParams(max_tokens=32, stop_token_ids=(stop,)))
    assert len(free.tokens) <= 3 and free.tokens[-1] == stop
    held = loop.run(prompt, SamplingParams(max_tokens=32, stop_token_ids=(stop,), min_tokens=12))
    assert len(held.tokens) >= 12 and stop not in held.tokens[:11]
