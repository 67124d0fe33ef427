"""Our paged model code against transformers on the same checkpoints, logits and tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.protocol import SamplingParams
from trd.tinymodels.build import save_random_checkpoint

ARCHS = [("qwen3", True), ("qwen2", False), ("llama", False)]
DECODE_STEPS = 64


@pytest.fixture(scope="module", params=ARCHS, ids=[a for a, _ in ARCHS])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    arch, tied = request.param
    out = tmp_path_factory.mktemp(arch)
    return save_random_checkpoint(arch, out, seed=7, tie_word_embeddings=tied)


def engine_logits(
    path: Path, dtype: str, prompts: list[list[int]], cpu_linear: str = "torch"
) -> dict[int, torch.Tensor]:
    """Prefill + DECODE_STEPS greedy decodes, all prompts batched; logits rows per request."""
    engine = Engine(
        EngineSpec.of(
            path,
            dtype=dtype,
            page_size=4,
            kv_tokens=1024,
            max_batch_tokens=32,
            cpu_linear=cpu_linear,
        )
    )
    params = SamplingParams(max_tokens=DECODE_STEPS + 1, ignore_eos=True)
    rids = [engine.add_request(p, params) for p in prompts]
    rows: dict[int, list[torch.Tensor]] = {rid: [] for rid in rids}
    seqs: dict[int, list[int]] = {}
    while engine.has_unfinished():
        result = engine.forward()
        assert result is not None
        for i, (req, token) in enumerate(zip(result.requests, result.tokens, strict=True)):
            rows[req.rid].append(result.forward.logits[i].clone())
            seqs[req.rid] = req.seq
            engine.commit(req, [token])
    return {rid: torch.stack(r) for rid, r in rows.items()} | {
        -1 - rid: torch.tensor(seqs[rid]) for rid in rids
    }


@pytest.mark.parametrize(
    "dtype,tol,cpu_linear",
    [("float64", 1e-9, "torch"), ("float32", 1e-4, "torch"), ("float32", 1e-4, "onednn")],
)
def test_prefill_and_decode_logits_match_transformers(
    checkpoint: Path, dtype: str, tol: float, cpu_linear: str
) -> None:
    prompts = [[5 + i for i in range(n)] for n in (3, 17, 40)]
    ours = engine_logits(checkpoint, dtype, prompts, cpu_linear)
    ref = AutoModelForCausalLM.from_pretrained(
        checkpoint, dtype=getattr(torch, dtype), attn_implementation="sdpa"
    ).eval()
    for rid, prompt in enumerate(prompts):
        seq = ours[-1 - rid]
        assert len(seq) == len(prompt) + DECODE_STEPS + 1
        with torch.no_grad():
            full = ref(seq[None, :-1]).logits[0]  # (L-1, V): logits for every next position
        expected = full[len(prompt) - 1 :]
        assert ours[rid].shape == expected.shape
        diff = (ours[rid] - expected).abs().max().item()
        assert diff <= tol, f"max |logit diff| {diff:.3g} > {tol}"


def test_onednn_linear_is_refused_outside_float32_on_cpu(checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="needs device cpu and dtype float32"):
        EngineSpec.of(checkpoint, dtype="float64", kv_tokens=64, cpu_linear="onednn")
    with pytest.raises(ValueError, match=r"engine.cpu_linear: 'mkl': expected one of"):
        EngineSpec.of(checkpoint, kv_tokens=64, cpu_linear="mkl")
