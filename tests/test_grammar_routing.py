"""Constrained generation routed between engines equals the float64 reference loop.

The grammar masks the logits on every engine before sampling and before the policy; the
matcher of a request follows it from engine to engine by its committed tokens. Engines
wired in one process (random interleavings, duplicated and reordered messages) must give
exactly the reference loop's constrained tokens, producers and finishes, with 1, 4 and
16 requests at once, for each policy (the learned ones with random heads) and for 3
models; and every output is valid.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trd.grammar.compile import grammar_for
from trd.policies.params import PolicySpec
from trd.protocol import FinishReason, SamplingParams
from trd.testing.reference import ReferenceRouter
from trd.testing.wiring import assert_matches

from grammar_cases import assert_valid, constrained_jobs
from routing_cases import INPROCESS_CASES, MODEL_SETS, process_cases, reference, wired

CONCURRENCY = [1, pytest.param(4, marks=pytest.mark.slow), 16]  # 4: the slow tier


@pytest.mark.parametrize("n", CONCURRENCY)
@pytest.mark.parametrize(
    "policy,params,n_models", INPROCESS_CASES, ids=[f"{c[0]}-{c[2]}" for c in INPROCESS_CASES]
)
def test_constrained_routing_matches_the_reference(
    tiny_models: dict[str, Path], policy: str, params: dict, n_models: int, n: int
) -> None:
    paths = [tiny_models[m] for m in MODEL_SETS[n_models]]
    cases = constrained_jobs(paths[0])
    work = [job for job, _ in cases]
    expected = reference(paths, policy, params, work)[:n]
    for (_, grammar), trace in zip(cases, expected, strict=False):
        assert trace.finish is FinishReason.STOP
        assert_valid(paths[0], grammar, trace.tokens)
    wiring = wired(paths, policy, params, seed=n + n_models)
    wiring.run(work[:n])
    assert_matches(wiring, expected)


GATED = ["citer", "r2r", "collm"]


@pytest.mark.parametrize("n", [1, 16])
@pytest.mark.parametrize("policy", GATED)
def test_gated_constrained_routing_matches_the_reference(
    tiny_models: dict[str, Path], heads: dict[str, Path], policy: str, n: int
) -> None:
    """The router heads read masked logits too (citer's and r2r's top log-probabilities,
    where a grammar forbids most tokens)."""
    params = next(p for name, p, _ in process_cases(heads) if name == policy)
    paths = [tiny_models[m] for m in MODEL_SETS[2]]
    work = [job for job, _ in constrained_jobs(paths[0])]
    expected = reference(paths, policy, params, work)[:n]
    assert all(t.finish is FinishReason.STOP for t in expected)
    assert any(m == 1 for t in expected for m in t.models)  # the large model takes turns
    wiring = wired(paths, policy, params, seed=n)
    wiring.run(work[:n])
    assert_matches(wiring, expected)


def test_a_grammar_that_allows_nothing_fails_the_request(tiny_models: dict[str, Path]) -> None:
    """ "yes" is all the grammar allows, but min_tokens bans eos after it: no valid token."""
    paths = [tiny_models["small"], tiny_models["large"]]
    params = SamplingParams(max_tokens=16, min_tokens=9, grammar=grammar_for("choice", ["yes"]))
    ref = ReferenceRouter(paths, PolicySpec("scripted", {"schedule": [1, 0]}))
    trace = ref.run([5, 6, 7], params)
    assert trace.finish is FinishReason.ERROR and trace.tokens
    wiring = wired(paths, "scripted", {"schedule": [1, 0]}, seed=1)
    wiring.submit(0, [5, 6, 7], params)
    got = wiring.tracked[0]
    while not got.complete:  # a failed request reports no Done: wait for its error
        wiring.tick()
    for _ in range(50):  # the ABORT to its other holder
        wiring.tick()
    assert got.finish is FinishReason.ERROR
    assert got.error.startswith("the grammar allows no next token"), got.error
    assert got.tokens == trace.tokens  # what was valid was committed, nothing after
    for e in wiring.engines:
        assert not e.requests
