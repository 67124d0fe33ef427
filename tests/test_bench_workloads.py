"""The benchmark's workloads and pair selection, without serving anything.

The chat workload renders the written prompts through the model's own chat template,
as the daemon's /v1/chat/completions does; `--pair demo|tiny` are `trd.demo.pair`'s pairs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trd.bench.chat_prompts import CHAT_PROMPTS
from trd.frontend.tokens import PromptEncoder

from benchkit.pairs import load_pair
from benchkit.workloads import WORKLOADS, chat_prompts, prompts

CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache"


def test_chat_prompts_go_through_the_template_in_a_seeded_order(
    tiny_models: dict[str, Path],
) -> None:
    folder = tiny_models["small"]
    every = chat_prompts(folder, seed=1, count=len(CHAT_PROMPTS))
    assert len({tuple(p) for p in every}) == len(CHAT_PROMPTS) == 32
    encoder = PromptEncoder(folder)
    rendered = {tuple(encoder.chat([{"role": "user", "content": t}])) for t in CHAT_PROMPTS}
    assert {tuple(p) for p in every} == rendered
    assert chat_prompts(folder, seed=1, count=5) == every[:5]  # a smaller run: a prefix
    assert chat_prompts(folder, seed=2, count=5) != every[:5]
    with pytest.raises(ValueError, match="has 32 prompts, 33 asked"):
        chat_prompts(folder, seed=1, count=33)


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
