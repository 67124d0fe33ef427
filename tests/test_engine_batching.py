"""Continuous batching is invisible in the output: token-exact against transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.protocol import FinishReason, SamplingParams

MAX_NEW = 24


def prompts() -> list[list[int]]:
    # 16 prompts of lengths 1..61, deterministic token ids inside the fixture vocab
    return [[(7 * i + 13 * j) % 1900 + 50 for j in range(1 + 4 * i)] for i in range(16)]


@pytest.fixture(scope="module")
def reference(tiny_models: dict[str, Path]) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(tiny_models["mid"], dtype=torch.float64).eval()
    outs = []
    for p in prompts():
        gen = model.generate(
            torch.tensor([p]), max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0
        )
        outs.append(gen[0, len(p) :].tolist())
    return outs


def run_staggered(engine: Engine) -> dict[int, list[int]]:
    """Request i arrives before step i, so prefills, extends and decodes mix in batches."""
    pending = prompts()
    outs: dict[int, list[int]] = {}
    finishes: dict[int, FinishReason] = {}
    step = 0
    while pending or engine.has_unfinished():
        if pending:
            rid = engine.add_request(pending.pop(0), SamplingParams(max_tokens=MAX_NEW))
            outs[rid] = []
        for out in engine.step():
            outs[out.rid].append(out.token)
            if out.finish is not FinishReason.NONE:
                finishes[out.rid] = out.finish
        engine.check_integrity()
        step += 1
    assert set(finishes) == set(outs)
    return outs


@pytest.mark.parametrize(
    "kv_tokens,max_batch_tokens",
    [(4096, 64), (160, 48)],  # the second forces chunked prefill and preemption
    ids=["roomy", "tight"],
)
def test_greedy_outputs_equal_transformers_generate(
    tiny_models: dict[str, Path],
    reference: list[list[int]],
    kv_tokens: int,
    max_batch_tokens: int,
) -> None:
    engine = Engine(
        EngineSpec.of(
            tiny_models["mid"],
            dtype="float64",
            page_size=8,
            kv_tokens=kv_tokens,
            max_batch_tokens=max_batch_tokens,
        )
    )
    outs = run_staggered(engine)
    assert [outs[rid] for rid in sorted(outs)] == reference
    assert (engine.scheduler.preemptions > 0) == (kv_tokens < 1000)
    assert engine.scheduler.allocator.num_free == engine.scheduler.allocator.num_pages


def test_abort_frees_pages_and_leaves_others_untouched(tiny_models: dict[str, Path]) -> None:
    engine = Engine(EngineSpec.of(tiny_models["small"], page_size=4, kv_tokens=256))
    keep = engine.add_request([60, 61, 62], SamplingParams(max_tokens=8, ignore_eos=True))
    drop = engine.add_request([70, 71, 72, 73, 74], SamplingParams(max_tokens=8))
    engine.step()
    assert engine.abort(drop) and not engine.abort(drop)
    engine.check_integrity()
    tokens = []
    while engine.has_unfinished():
        tokens += [o.token for o in engine.step() if o.rid == keep]
    alone = Engine(EngineSpec.of(tiny_models["small"], page_size=4, kv_tokens=256))
    expected = alone.generate([[60, 61, 62]], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert tokens == expected[1:]
    assert engine.scheduler.allocator.num_free == engine.scheduler.allocator.num_pages
