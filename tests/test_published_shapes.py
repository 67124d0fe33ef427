"""Tiny checkpoints with the config quirks of published families, against transformers.

Each shape keeps what makes its family's config.json different (qk-norm, biases, tied
or untied embeddings, grouped-query ratio, head_dim != hidden / heads, rope scaling, a
padded vocabulary) at a size that runs in a fraction of a second. Prefill (chunked)
and 64 greedy decodes of three prompts batched, against transformers run on the same
sequences with a KV cache: float64 within 1e-9, float32 within 1e-4, and bfloat16 on
CPU against transformers in bfloat16 (see BF16_REL).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from trd.models.checkpoint import read_checkpoint
from trd.protocol import SamplingParams
from trd.testing.tinymodels.build import save_random_checkpoint
from trd.testing.tinymodels.tokenizer import VOCAB_SIZE

from hf_compare import engine_runs, hf_logits, max_diff

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}  # fmt: skip
Arch = Literal["qwen3", "qwen2", "llama"]  # save_random_checkpoint's architectures
# name: (arch, tie_word_embeddings, config overrides); published model it stands for
SHAPES: dict[str, tuple[Arch, bool, dict[str, Any]]] = {
    # Qwen3-0.6B: qk-norm, tied, head_dim 128 with hidden 1024 / 16 heads = 64
    "qwen3-tied": ("qwen3", True, {"head_dim": 32}),
    # Qwen3-32B: untied; attention_bias is a Qwen3 config key (all four projections)
    "qwen3-untied-bias": ("qwen3", False, {"attention_bias": True}),
    # Qwen2.5-0.5B: q/k/v biases (never on o), tied, sliding-window keys present but off
    "qwen2-tied": ("qwen2", True, {"use_sliding_window": False, "sliding_window": 32,
                                   "max_window_layers": 1, "rope_theta": 1000000.0}),
    # DeepSeek-R1-Distill-Qwen: qwen2, untied, 64 padding rows past the tokenizer's ids
    "r1-distill-padded": ("qwen2", False, {"vocab_size": VOCAB_SIZE + 64}),
    # Llama-3.2-1B: rope llama3, tied, 32 heads on 8 KV heads (ratio 4)
    "llama3.2-gqa4": ("llama", True, {"rope_parameters": LLAMA3_ROPE, "num_attention_heads": 8,
                                      "num_key_value_heads": 2, "max_position_embeddings": 256}),
    # Llama-3.1-70B: rope llama3, untied, 64 heads on 8 KV heads (ratio 8)
    "llama3.1-gqa8": ("llama", False, {"rope_parameters": LLAMA3_ROPE, "num_attention_heads": 8,
                                       "num_key_value_heads": 1, "hidden_size": 128,
                                       "max_position_embeddings": 256}),
    # SmolLM2-135M: llama, tied, 9 heads on 3 KV heads, theta 1e5
    "smollm2": ("llama", True, {"hidden_size": 144, "num_attention_heads": 9,
                                "num_key_value_heads": 3, "head_dim": 16,
                                "rope_parameters": {"rope_type": "default",
                                                    "rope_theta": 100000.0}}),
    # Llama config keys our model code implements: biases on attention and MLP
    "llama-biases": ("llama", False, {"attention_bias": True, "mlp_bias": True}),
}  # fmt: skip
PROMPTS = [[5 + i for i in range(n)] for n in (3, 17, 40)]
# bfloat16 keeps 8 mantissa bits: at the largest logit (3-5 here) one step is 2^-6,
# 0.3-0.5% of it. Every matmul, norm and rope product rounds there, in a different order
# in our paged attention than in transformers' SDPA, so two correct bf16 runs differ by
# a step or two: measured at most 0.94% of the largest logit over these shapes. The
# bound, relative to that scale, is 2% (about four steps); a wrong rope, bias or head
# layout moves logits by tens of percent.
BF16_REL = 0.02
BF16_GREEDY_STEPS = 8


@pytest.fixture(scope="module", params=list(SHAPES))
def shape(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    arch, tied, overrides = SHAPES[request.param]
    out = tmp_path_factory.mktemp(request.param)
    return save_random_checkpoint(arch, out, seed=11, tie_word_embeddings=tied, **overrides)


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-9), ("float32", 1e-4)])
def test_logits_match_transformers(shape: Path, dtype: str, tol: float) -> None:
    runs = engine_runs(shape, dtype, PROMPTS)
    diff = max_diff(shape, dtype, runs)
    assert diff <= tol, f"max |logit diff| {diff:.3g} > {tol}"
    # Padding rows are cut: every model yields logits over the tokenizer's ids only.
    assert {run.logits.shape[1] for run in runs} == {VOCAB_SIZE}
    assert all(max(run.seq) < VOCAB_SIZE for run in runs)


def test_bfloat16_on_cpu_matches_transformers_in_bfloat16(shape: Path) -> None:
    runs = engine_runs(shape, "bfloat16", PROMPTS, steps=BF16_GREEDY_STEPS)
    for run in runs:
        ref = hf_logits(shape, "bfloat16", run)[:, :VOCAB_SIZE].float()
        scale = ref.abs().max().item()
        diff = (run.logits - ref).abs().max().item()
        assert diff <= BF16_REL * scale, f"|diff| {diff:.3g} > {BF16_REL} x scale {scale:.3g}"
        # Greedy: our token is the reference's top one up to the bound (a near tie may go
        # either way) at every step, and exactly its top one at most steps.
        ours = torch.tensor(run.seq[run.prompt_len :])
        chosen = ref.gather(1, ours[:, None])[:, 0]
        assert (chosen >= ref.max(-1).values - 2 * BF16_REL * scale).all()
        assert (ours == ref.argmax(-1)).float().mean() >= 0.75


def test_padded_rows_are_in_the_checkpoint_but_not_in_the_vocabulary(tmp_path: Path) -> None:
    arch, tied, overrides = SHAPES["r1-distill-padded"]
    path = save_random_checkpoint(arch, tmp_path, seed=11, tie_word_embeddings=tied, **overrides)
    ckpt = read_checkpoint(path)
    assert (ckpt.config.vocab_size, ckpt.vocab_limit) == (VOCAB_SIZE + 64, VOCAB_SIZE)


def test_float16_at_a_tiny_temperature_samples_the_greedy_tokens(tmp_path: Path) -> None:
    # logits / 1e-4 in float16 overflow to inf and softmax turns them into NaN; sampling
    # math runs in float32, so a near-zero temperature is greedy, not garbage.
    path = save_random_checkpoint("llama", tmp_path, seed=3, tie_word_embeddings=False)
    greedy = engine_runs(path, "float16", PROMPTS, steps=16)
    cold = engine_runs(path, "float16", PROMPTS, steps=16, temperature=1e-4)
    assert [r.seq for r in cold] == [r.seq for r in greedy]
    assert SamplingParams(temperature=1e-4).temperature >= 1e-5  # not the greedy shortcut
