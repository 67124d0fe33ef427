"""Speculative decoding in one engine (trd/engines/speculate.py): an engine that verifies a
draft model's proposals commits exactly the tokens it commits without one, for one
request or several, at every length limit and stop, through preemption and the prefix
cache; proposals are accepted while they equal its own tokens (a draft that is the model
itself has every one accepted); a step with a request that cannot be speculated (sampled,
log-probabilities, a grammar, an early-stop ban), or with more requests than draft_rows
allows, runs as a plain step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trd.engines.engine import Engine
from trd.engines.spec import DraftModel, EngineSpec
from trd.grammar.compile import grammar_for
from trd.models import qkernel
from trd.models.checkpoint import read_checkpoint
from trd.protocol import FinishReason, SamplingParams

from routing_cases import prompts

# int8 on CPU: each row's linears do not depend on the rows beside it, and output tokens
# attend token by token, so a verified row is bit for bit the decode step's.
pytestmark = pytest.mark.skipif(qkernel.why_not() is not None, reason=str(qkernel.why_not()))
QUANT = "int8"


def _engine(models: dict[str, Path], draft: str | None, kv_tokens: int = 4096,
            **settings: Any) -> Engine:  # fmt: skip
    spec = EngineSpec.of(
        models["large"], kv_tokens=kv_tokens, dtype="float32", quantization=QUANT, page_size=16,
        draft=None if draft is None else DraftModel(read_checkpoint(models[draft]), "float32",
                                                    QUANT),
        **settings,
    )  # fmt: skip
    return Engine(spec)


def _run(
    engine: Engine, jobs: list[tuple[list[int], SamplingParams]]
) -> tuple[list[list[int]], int]:
    """Each job's output tokens and finish, and how many steps the engine took."""
    rids = [engine.add_request(p, params) for p, params in jobs]
    out: dict[int, list[int]] = {rid: [] for rid in rids}
    steps = 0
    while engine.has_unfinished():
        for o in engine.step():
            assert o.finish is not FinishReason.ERROR, o.error
            out[o.rid].append(o.token)
        engine.check_integrity()
        steps += 1
    return [out[rid] for rid in rids], steps


@pytest.fixture(scope="module")
def plain(tiny_models: dict[str, Path]) -> Engine:
    return _engine(tiny_models, None)


@pytest.fixture(scope="module")
def drafted(tiny_models: dict[str, Path]) -> Engine:
    return _engine(tiny_models, "small")


def _jobs(
    tiny_models: dict[str, Path], count: int, **params: object
) -> list[tuple[list[int], SamplingParams]]:
    return [(p, SamplingParams(**params)) for p in prompts(tiny_models["small"], count)]  # type: ignore[arg-type]


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_a_drafted_engine_commits_what_it_commits_alone(
    tiny_models: dict[str, Path], plain: Engine, drafted: Engine, batch: int
) -> None:
    jobs = _jobs(tiny_models, 6, max_tokens=40, ignore_eos=True)
    for i in range(0, len(jobs), batch):
        want, plain_steps = _run(plain, jobs[i : i + batch])
        got, steps = _run(drafted, jobs[i : i + batch])
        assert got == want
        assert steps < plain_steps  # proposals were accepted: fewer steps than tokens


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 6, 17])
def test_length_limits_hold_exactly(
    tiny_models: dict[str, Path], plain: Engine, drafted: Engine, max_tokens: int
) -> None:
    jobs = _jobs(tiny_models, 2, max_tokens=max_tokens, ignore_eos=True)
    want, _ = _run(plain, jobs)
    got, _ = _run(drafted, jobs)
    assert got == want
    assert all(len(g) == max_tokens for g in got)


def test_a_stop_inside_accepted_proposals_ends_the_output_there(
    tiny_models: dict[str, Path], plain: Engine, drafted: Engine
) -> None:
    jobs = _jobs(tiny_models, 4, max_tokens=40, ignore_eos=True)
    free, _ = _run(plain, jobs)
    # Stop at the 7th token each would write: a stop the draft proposes with others after it.
    stops = [(p, SamplingParams(max_tokens=40, ignore_eos=True, stop_token_ids=(f[6],)))
             for (p, _), f in zip(jobs, free, strict=True)]  # fmt: skip
    want, _ = _run(plain, stops)
    got, _ = _run(drafted, stops)
    assert got == want
    assert all(g[-1] in params.stop_token_ids for g, (_, params) in zip(got, stops, strict=True))


def test_a_draft_that_is_the_model_itself_has_every_proposal_accepted(
    tiny_models: dict[str, Path], plain: Engine
) -> None:
    itself = _engine(tiny_models, "large", draft_tokens=4)
    jobs = _jobs(tiny_models, 1, max_tokens=41, ignore_eos=True)
    want, _ = _run(plain, jobs)
    got, steps = _run(itself, jobs)
    assert got == want
    # the prompt's step writes 1; each step after it 4 proposals and its own token
    assert steps == 1 + 40 // 5


def test_requests_a_draft_cannot_serve_and_full_batches_step_plainly(
    tiny_models: dict[str, Path], plain: Engine, drafted: Engine
) -> None:
    base = _jobs(tiny_models, 5, max_tokens=24, ignore_eos=True)
    asks = [
        SamplingParams(max_tokens=24, temperature=0.8, seed=3),
        SamplingParams(max_tokens=24, logprobs=2),
        SamplingParams(max_tokens=24, min_tokens=20, ignore_eos=False),
        SamplingParams(max_tokens=24, grammar=grammar_for("regex", "[a-z ]{1,40}")),
    ]
    for params in asks:  # each beside a greedy one: the step is plain while it runs
        jobs = [(base[0][0], params), base[1]]
        want, _ = _run(plain, jobs)
        got, _ = _run(drafted, jobs)
        assert got == want, params
    # five greedy requests: 8 rows / 5 requests leaves no room for proposals
    want, plain_steps = _run(plain, base)
    got, steps = _run(drafted, base)
    assert got == want
    assert steps == plain_steps


def test_preemption_and_the_prefix_cache_keep_the_tokens(tiny_models: dict[str, Path]) -> None:
    """Few pages: requests preempt each other (their pages, and the draft's KV over them,
    dropped and recomputed); the same prompts again start from cached blocks."""
    jobs = _jobs(tiny_models, 3, max_tokens=100, ignore_eos=True)
    small_plain = _engine(tiny_models, None, kv_tokens=160, max_batch_size=2)
    small_drafted = _engine(tiny_models, "small", kv_tokens=160, max_batch_size=2)
    want, _ = _run(small_plain, jobs)
    for _ in range(2):
        got, _ = _run(small_drafted, jobs)
        assert got == want
    assert small_drafted.scheduler.preemptions > 0
