"""Our paged model code against transformers on the same checkpoints, logits and tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trd.engines.spec import EngineSpec
from trd.models.packed import PackedLinear, onednn_available
from trd.testing.tinymodels.build import save_random_checkpoint

from hf_compare import DECODE_STEPS, engine_runs, load_hf

ARCHS = [("qwen3", True), ("qwen2", False), ("llama", False)]


@pytest.fixture(scope="module", params=ARCHS, ids=[a for a, _ in ARCHS])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    arch, tied = request.param
    out = tmp_path_factory.mktemp(arch)
    return save_random_checkpoint(arch, out, seed=7, tie_word_embeddings=tied)


@pytest.mark.parametrize(
    "dtype,tol,cpu_linear",
    [("float64", 1e-9, "torch"), ("float32", 1e-4, "torch"), ("float32", 1e-4, "onednn")],
)
def test_prefill_and_decode_logits_match_transformers(
    checkpoint: Path, dtype: str, tol: float, cpu_linear: str
) -> None:
    prompts = [[5 + i for i in range(n)] for n in (3, 17, 40)]
    runs = engine_runs(checkpoint, dtype, prompts, cpu_linear=cpu_linear)
    ref = load_hf(checkpoint, dtype)
    for run in runs:
        seq = torch.tensor(run.seq)
        assert len(seq) == run.prompt_len + DECODE_STEPS + 1
        with torch.no_grad():  # the whole sequence in one call: no KV cache on this side
            full = ref(seq[None, :-1]).logits[0]  # (L-1, V): logits for every next position
        expected = full[run.prompt_len - 1 :]
        assert run.logits.shape == expected.shape
        diff = (run.logits - expected).abs().max().item()
        assert diff <= tol, f"max |logit diff| {diff:.3g} > {tol}"


def test_onednn_linear_is_refused_outside_float32_on_cpu(checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="needs device cpu and dtype float32"):
        EngineSpec.of(checkpoint, dtype="float64", kv_tokens=64, cpu_linear="onednn")
    with pytest.raises(ValueError, match=r"engine.cpu_linear: 'mkl': expected one of"):
        EngineSpec.of(checkpoint, kv_tokens=64, cpu_linear="mkl")


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear")
@pytest.mark.parametrize("shape", [(1, 24), (2, 24), (3, 24), (5, 24), (2, 3, 24)])
def test_packed_linear_pads_few_rows_and_keeps_the_shape(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(24, 40)
    x = torch.randn(*shape)
    got = PackedLinear(linear)(x)
    assert got.shape == (*shape[:-1], 40)
    torch.testing.assert_close(got, linear(x), rtol=1e-5, atol=1e-5)
