"""The benchmark's workloads and pair selection, without serving anything.

The chat workload renders the written prompts through the model's own chat template,
as the daemon's /v1/chat/completions does; `--pair demo|tiny` are `trd.demo.pair`'s pairs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trd.bench.chat_prompts import CHAT_PROMPTS
from trd.bench.compare.pairs import load_pair
from trd.bench.compare.workloads import WORKLOADS, prompts
from trd.frontend.tokens import PromptEncoder

CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache"


def test_chat_prompts_go_through_the_template_in_a_seeded_order(
    tiny_models: dict[str, Path],
) -> None:
    folder = tiny_models["small"]
    chat = WORKLOADS["demo"]["short"]
    every = prompts(folder, chat, len(CHAT_PROMPTS))
    assert len({tuple(p) for p in every}) == len(CHAT_PROMPTS) == 32
    encoder = PromptEncoder(folder)
    rendered = {tuple(encoder.chat([{"role": "user", "content": t}])) for t in CHAT_PROMPTS}
    assert {tuple(p) for p in every} == rendered
    assert prompts(folder, chat, 5) == every[:5]  # a smaller run: a prefix
    assert prompts(folder, replace(chat, seed=2), 5) != every[:5]
    with pytest.raises(ValueError, match="has 32 prompts, 33 asked"):
        prompts(folder, chat, 33)


def test_corpus_prompts_have_the_workloads_exact_length(tiny_models: dict[str, Path]) -> None:
    short = WORKLOADS["tiny"]["short"]
    got = prompts(tiny_models["small"], short, 3)
    assert [len(p) for p in got] == [short.prompt_tokens] * 3 and len(set(map(tuple, got))) == 3


def test_the_real_tokenizer_frames_each_chat_prompt() -> None:
    from trd.testing.smollm2 import ensure_smollm2

    try:
        folder = ensure_smollm2(CACHE_DIR)
    except FileNotFoundError as exc:
        pytest.skip(f"no SmolLM2 checkpoint: {exc}")
    encoder = PromptEncoder(folder)
    start = encoder.encode("<|im_start|>system\n")
    end = encoder.encode("<|im_start|>assistant\n")
    for ids in prompts(folder, WORKLOADS["demo"]["short"], 32):
        assert ids[: len(start)] == start and ids[-len(end) :] == end


def test_pairs_are_the_demo_pairs(tiny_models: dict[str, Path]) -> None:
    pair = load_pair("tiny", CACHE_DIR)
    assert pair.models == {"small": tiny_models["small"], "large": tiny_models["large"]}
    assert pair.workloads == WORKLOADS["tiny"]
    described = pair.describe()["models"]
    assert described["large"]["layers"] > described["small"]["layers"]
    with pytest.raises(ValueError, match="'big' is not one of demo, tiny"):
        load_pair("big")
