"""The Qwen3-shaped random checkpoints: published shapes and parameter counts, sharded
files our reader and transformers load, and the greedy behaviour they are built for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.models.checkpoint import ModelConfig, read_checkpoint
from trd.protocol import SamplingParams
from trd.testing.shaped import SHAPES, Shape, write_checkpoint
from trd.testing.tinymodels.tokenizer import VOCAB_SIZE


def test_shapes_are_qwen3_0_6b_and_8b() -> None:
    small = ModelConfig.from_dict(SHAPES["0.6b"].config(), "0.6b")
    large = ModelConfig.from_dict(SHAPES["8b"].config(), "8b")
    facts = [(c.hidden_size, c.intermediate_size, c.num_layers, c.num_heads, c.num_kv_heads,
              c.head_dim, c.vocab_size, c.tie_word_embeddings, c.qk_norm, c.rope.theta,
              c.context) for c in (small, large)]  # fmt: skip
    assert facts == [
        (1024, 3072, 28, 16, 8, 128, 151936, True, True, 1e6, 40960),
        (4096, 12288, 36, 32, 8, 128, 151936, False, True, 1e6, 40960),
    ]
    # Qwen's model cards: 0.6B (0.44B without embeddings), 8.2B (6.95B without).
    assert SHAPES["0.6b"].num_params() == 596_049_920
    assert SHAPES["8b"].num_params() == 8_190_735_360


@pytest.mark.parametrize("tied", [True, False])
def test_a_small_shape_loads_and_decodes_as_designed(tmp_path: Path, tied: bool) -> None:
    shape = Shape(f"mini-{tied}", 64, 128, 2, 4, 2, tied=tied, head_dim=16, vocab=4096)
    path = write_checkpoint(shape, tmp_path, shard_bytes=200_000)  # several shards
    ckpt = read_checkpoint(path)
    assert len(ckpt.weight_files) >= 2 and ckpt.num_params == shape.num_params()
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert {Path(f).name for f in index["weight_map"].values()} == {
        f.name for f in ckpt.weight_files
    }
    engine = Engine(EngineSpec.of(path, kv_tokens=512))
    prompts = [[5, 6, 7], [40, 2047], [1000]]
    outs = engine.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    step = 0 if tied else 1  # the tied head repeats the token, the untied one adds one
    for prompt, out in zip(prompts, outs, strict=True):
        expect = [(prompt[-1] + step * (i + 1)) % VOCAB_SIZE for i in range(6)]
        assert out == expect
    # transformers reads the sharded checkpoint too (the official-style loop uses it).
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.inference_mode():
        logits = hf(torch.tensor([prompts[0] + outs[0][:-1]])).logits[0, -1]
    assert int(logits.argmax()) == outs[0][-1]
