"""Padded steps on CPU: the CUDA-graph path without the capture (same buffers, same
padding, eager replay) gives the tokens of the unpadded engine, float64 and token-exact,
for decode and for extend batches of mixed lengths, and writes nothing outside the
requests' own pages but the scratch page."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trd.engines.engine import Engine
from trd.engines.graphs import StepGraphs
from trd.engines.spec import EngineSpec
from trd.protocol import FinishReason, SamplingParams

# Requests arrive while others decode, so steps mix decodes with prompt extends of
# 2..8 tokens (graphed) and longer prompts (eager).
ARRIVALS = {0: [[5, 6, 7], [9] * 20], 2: [[40, 41]], 3: [[50, 51, 52, 53, 54, 55, 56, 57]]}
ARRIVALS |= {5: [[60 + i for i in range(n)] for n in (2, 3, 4, 5, 6, 7)], 9: [[33] * 12]}


def spec(path: Path) -> EngineSpec:
    return EngineSpec.of(
        path, dtype="float64", kv_tokens=4096, max_batch_size=16,
        graph_batch_sizes=(1, 2, 4, 8, 16), graph_extend_lens=(2, 4, 8),
    )  # fmt: skip


def run(engine: Engine) -> dict[int, list[int]]:
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    out: dict[int, list[int]] = {}
    for tick in range(200):
        for prompt in ARRIVALS.get(tick, []):
            out[engine.add_request(prompt, params)] = []
        for o in engine.step():
            assert o.finish is not FinishReason.ERROR, o.error
            out[o.rid].append(o.token)
        engine.check_integrity()
        if tick > max(ARRIVALS) and not engine.has_unfinished():
            return out
    raise AssertionError("the workload did not finish")


@pytest.fixture(scope="module")
def unpadded(tiny_models: dict[str, Path]) -> dict[int, list[int]]:
    return run(Engine(spec(tiny_models["large"])))


def padded_engine(path: Path) -> Engine:
    engine = Engine(spec(path))
    engine.runner.graphs = StepGraphs(engine.runner, engine.spec.settings, capture=False)
    return engine


def test_padded_steps_give_the_unpadded_tokens(
    tiny_models: dict[str, Path], unpadded: dict[int, list[int]]
) -> None:
    engine = padded_engine(tiny_models["large"])
    assert run(engine) == unpadded
    graphs = engine.runner.graphs
    assert graphs is not None and graphs.eager_steps >= 2  # the 20- and 12-token prompts
    used = graphs.used
    assert sum(n for s, n in used.items() if s.is_decode) >= 10
    extends = {s.q_len for s in used if not s.is_decode}
    assert len(extends) >= 2  # extend buckets of several lengths, decodes mixed in
    assert len(unpadded) == 11 and all(len(t) == 12 for t in unpadded.values())


def test_padding_writes_no_page_but_the_scratch_page(tiny_models: dict[str, Path]) -> None:
    """After every step, pages no request holds are still zero (dummies write to the
    scratch page, which is past the allocator's)."""
    engine = padded_engine(tiny_models["large"])
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    for prompt in ([5, 6, 7], [8, 9], [10, 11, 12, 13, 14]):
        engine.add_request(prompt, params)
    assert engine.runner.scratch_page == engine.spec.kv_pages  # the allocator's pages end before
    for _ in range(5):  # before the first request finishes and leaves written pages free
        engine.step()
        held = {p for r in engine.scheduler.requests.values() for p in r.pages}
        free = [p for p in range(engine.spec.kv_pages) if p not in held]
        for cache in engine.runner.kv_caches:  # (2, pages + 1, page, kv heads, head dim)
            assert torch.count_nonzero(cache[:, free]) == 0
    assert engine.runner.graphs is not None and engine.runner.graphs.used.total() == 5
