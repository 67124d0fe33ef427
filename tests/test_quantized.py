"""Quantised weights: the kernel against its float64 definition, the formats, the GGUF
blocks, the served logits against the float model, routing against the oracle on the
same quantised layers, and what the config and the memory plan make of them."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from trd.config import ConfigError, from_dict
from trd.engines.runner import ModelRunner
from trd.engines.spec import EngineSpec
from trd.memplan.plan import model_mem
from trd.models import qkernel
from trd.models.attention import BatchLayout
from trd.models.checkpoint import read_checkpoint
from trd.models.gguf_quant import q4_k
from trd.models.qformat import QuantTensor, quantize, tile, untile
from trd.models.qlinear import QuantLinear
from trd.models.quantization import marker, quantised_bytes
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.testing.reference import ReferenceRouter
from trd.testing.wiring import Wiring, assert_matches

from routing_cases import prompts, specs

needs_kernel = pytest.mark.skipif(qkernel.why_not() is not None, reason=str(qkernel.why_not()))


def _layer(bits: int, n: int = 64, k: int = 96, seed: int = 0) -> QuantLinear:
    gen = torch.Generator().manual_seed(seed)
    w, b = torch.randn(n, k, generator=gen) * 0.1, torch.randn(n, generator=gen)
    return QuantLinear(quantize(w, bits), b)


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_computes_its_float64_definition(bits: int, dtype: torch.dtype) -> None:
    """float64 input takes the reference path (activations quantised per row and group of
    32 in float64): the kernel's float32 result agrees to float32 rounding, and a row's
    result is the same bits whatever else is in the batch."""
    layer = _layer(bits)
    x = (torch.randn(9, 96, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    got = layer(x)
    want = layer(x.double())
    tol = 2e-6 if dtype == torch.float32 else 1e-2  # bfloat16 output: 8 bits of mantissa
    assert got.dtype == dtype
    assert ((got.double() - want).abs().max() / want.abs().max()).item() < tol
    for rows in (slice(0, 1), slice(3, 4), slice(2, 7)):
        assert torch.equal(layer(x[rows].contiguous()), got[rows])


@pytest.mark.parametrize("bits", [4, 8])
def test_formats_round_trip_and_quantise_within_half_a_step(bits: int) -> None:
    w = torch.randn(24, 64, generator=torch.Generator().manual_seed(2))
    qt = quantize(w, bits)
    back = untile(bits, *tile(qt))
    assert torch.equal(back.q, qt.q) and torch.equal(back.scales, qt.scales)
    rows = torch.tensor([17, 0, 9])
    assert torch.equal(untile(bits, *tile(qt), rows).dequantize(), qt.dequantize()[rows])
    step = qt.scales.float().repeat_interleave(32, dim=1)
    assert ((qt.dequantize() - w).abs() <= step * 0.5 + 1e-3 * step).all()
    stored = QuantTensor.from_tensors("m.w", qt.tensors("m.w"))
    assert stored.bits == bits and torch.equal(stored.dequantize(), qt.dequantize())
    with pytest.raises(ValueError, match=r"m\.w\.scales: torch.float32"):
        QuantTensor.from_tensors("m.w", {**qt.tensors("m.w"), "m.w.scales": qt.scales.float()})


def test_q4_k_blocks_are_read_exactly() -> None:
    """Random Q4_K blocks (any bytes are a valid block once d and dmin are finite), with
    power-of-two d and dmin so that every d * sc fits float16: our 4-bit weights
    dequantise to gguf's values exactly."""
    rng = np.random.default_rng(3)
    rows, blocks = 16, 2
    data = rng.integers(0, 256, (rows, blocks, 144), dtype=np.uint8)
    d = (2.0 ** rng.integers(-12, -6, (rows, blocks, 2))).astype(np.float16)
    data[..., 0:4] = d.view(np.uint8).reshape(rows, blocks, 4)
    data = data.reshape(rows, blocks * 144)
    want = dequantize(data, T.Q4_K)
    assert np.array_equal(q4_k(data).dequantize().numpy(), want)


@pytest.fixture(scope="module")
def large(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["large"]


def _prefill_logits(path: Path, dtype: str, quantization: str, ids: list[int]) -> torch.Tensor:
    spec = EngineSpec.of(path, kv_tokens=256, dtype=dtype, quantization=quantization,
                         quant_dense_from=0)  # the kernel at every row count  # fmt: skip
    runner = ModelRunner(spec)
    assert quantization == "none" or set(runner.crossover.values()) == {None}
    n = len(ids)
    layout = BatchLayout([n], [0], [list(range(-(-n // 16)))], 16)
    pos = np.arange(n)
    with torch.inference_mode():
        logits, _, _ = runner.run(runner.backend, layout, np.asarray(ids), pos, pos + 1, pos)
    return logits.double()


# Measured on the large fixture, 60 positions of held-out text (float32 activations):
# KL(float || quantised) mean int8 4e-5, int4 5e-4; every greedy token agrees.
TOLERANCE = {"int8": 2e-4, "int4": 3e-3}


@needs_kernel
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantised_logits_stay_within_the_measured_tolerance(large: Path, mode: str) -> None:
    ids = prompts(large, 12)[-1]
    ref = _prefill_logits(large, "float32", "none", ids)
    got = _prefill_logits(large, "float32", mode, ids)
    kl = torch.nn.functional.kl_div(
        got.log_softmax(-1), ref.log_softmax(-1), log_target=True, reduction="none"
    ).sum(-1)
    assert 0 < kl.mean().item() < TOLERANCE[mode]
    assert (got.argmax(-1) == ref.argmax(-1)).double().mean().item() >= 0.95


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_greedy_routing_matches_the_oracle_on_the_same_quantised_layers(
    tiny_models: dict[str, Path], mode: str
) -> None:
    """Engines and the reference loop quantise the same float checkpoints at load; float64
    runs compute what the kernel defines, so the routed tokens are the oracle's."""
    paths = [tiny_models["small"], tiny_models["large"]]
    work = [(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in prompts(paths[0], 4)[1:]]
    policy = {"threshold": 0.78}
    ref = ReferenceRouter(paths, PolicySpec("rstitch", policy), quantization=mode)
    expected = [ref.run(p, sp) for p, sp in work]
    engines = [dataclasses.replace(s, quantization=mode)
               for s in specs(paths, "rstitch", policy, kv_tokens=2048)]  # fmt: skip
    wiring = Wiring(engines, seed=5)
    wiring.run(work)
    assert_matches(wiring, expected)
    assert {m for t in expected for m in t.models} == {0, 1}  # both models wrote tokens


def _quantised_copy(src: Path, out: Path, mode: str) -> Path:
    """src's matrices quantised into a checkpoint with our marker, as an import writes."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, out)
    tensors = {}
    for name, t in load_file(src / "model.safetensors").items():
        layer = name.removesuffix(".weight")
        if t.dim() == 2 and name.endswith(".weight"):
            tensors |= quantize(t, 4 if mode == "int4" and "layers" in name else 8).tensors(layer)
        else:
            tensors[name] = t
    save_file(tensors, str(out / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text()) | marker(mode)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_a_quantised_checkpoint_is_planned_served_and_refused_as_stored(
    large: Path, tmp_path: Path
) -> None:
    q = _quantised_copy(large, tmp_path / "q", "int4")
    ckpt = read_checkpoint(q)
    assert ckpt.quantization == "int4"
    expected = (
        sum(quantised_bytes(rows, cols, bits) for _, rows, cols, bits in ckpt.matrices)
        + (ckpt.num_params - ckpt.quantized_params) * 4
    )
    mem = model_mem("large", ckpt, "float32", "cpu", 64)
    assert mem.weight_bytes == expected == ckpt.weight_bytes("float32")
    assert mem.quantization == "int4"
    assert mem.unquantized_bytes == read_checkpoint(large).weight_bytes("float32")
    float_mem = model_mem(
        "large", read_checkpoint(large), "float32", "cpu", 64, quantization="int4"
    )
    assert float_mem.weight_bytes == expected  # quantised at load: the same bytes
    base = {"device": "cpu", "models": [{"name": "m", "path": str(q)}]}
    assert from_dict(base, tmp_path).models[0].quantization == "int4"
    bad = {**base, "models": [{"name": "m", "path": str(q), "quantization": "int8"}]}
    with pytest.raises(ConfigError, match=r"models\[0\]\.quantization: .*quantised \(int4\)"):
        from_dict(bad, tmp_path)
    ids = prompts(large, 12)[-1]
    served = _prefill_logits(q, "float32", "none", ids)
    at_load = _prefill_logits(large, "float32", "int4", ids)
    assert torch.allclose(served, at_load, atol=1e-4)  # the same layers, either way


@needs_kernel
def test_fused_projections_compute_what_separate_ones_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen2 (q/k/v biases, no q/k norm: q and k rotated in one pass): q, k, v and gate, up
    each in one kernel call give the logits of one call per projection."""
    from safetensors.torch import load_file, save_file

    from trd.models import quantize as quantize_module
    from trd.testing.tinymodels.build import save_random_checkpoint

    path = save_random_checkpoint("qwen2", tmp_path / "m", seed=4, tie_word_embeddings=True)
    weights = load_file(path / "model.safetensors")
    torch.manual_seed(5)  # distinct biases and norms: a dropped or misplaced one shows
    save_file({k: v + torch.randn_like(v) if v.dim() == 1 else v for k, v in weights.items()},
              str(path / "model.safetensors"))  # fmt: skip
    ids = list(range(5, 45))
    fused = _prefill_logits(path, "float32", "int4", ids)
    monkeypatch.setattr(quantize_module, "fuse_layers", lambda model: None)
    separate = _prefill_logits(path, "float32", "int4", ids)
    assert torch.allclose(fused, separate, atol=1e-4, rtol=0)
    assert (fused - _prefill_logits(path, "float32", "none", ids)).abs().max() > 1e-3


@needs_kernel
def test_the_native_glue_computes_what_torch_does() -> None:
    """RMSNorm, rotation in place (strided rows, as in the fused q/k/v output) and the
    attention of one-token queries over scattered KV pages, against the torch code."""
    from trd.models.attention.torch_paged import TorchPagedAttention
    from trd.models.model import RMSNorm, apply_rope
    from trd.models.rope import RopeConfig
    from trd.models.rotary import RotaryEmbedding

    native = qkernel.load()
    assert native is not None
    gen = torch.Generator().manual_seed(6)
    norm = RMSNorm(96, 1e-6)
    norm.weight.data = torch.randn(96, generator=gen)
    x = torch.randn(3, 96, generator=gen) * 4
    want = norm(x)
    norm.native = native
    assert torch.allclose(norm(x), want, atol=1e-5, rtol=1e-5)

    t, h, kvh, d = 3, 4, 2, 32
    rope = RotaryEmbedding(RopeConfig(), d, torch.device("cpu"))
    cos, sin = rope.cos_signed_sin(torch.tensor([5, 17, 40]), np.array([6, 18, 41]), torch.float32)
    qkv = torch.randn(t, (h + 2 * kvh) * d, generator=gen)
    qk = qkv[:, : (h + kvh) * d].view(t, h + kvh, d)
    want = apply_rope(qk, cos, sin)
    native.rope_(qk, cos, sin)
    assert torch.allclose(qk, want, atol=1e-5)

    tables = [[3, 0, 7], [5], [1, 2, 6, 4]]  # pages of 16, out of order
    layout = BatchLayout([1, 1, 1], [40, 9, 60], tables, 16)
    kv_cache = torch.randn(2, 8, 16, kvh, d, generator=gen)
    q, k, v = (torch.randn(t, n, d, generator=gen) for n in (h, kvh, kvh))
    outs = []
    for glue in (None, native):
        backend = TorchPagedAttention(torch.device("cpu"))
        backend.native = glue
        backend.plan(layout)
        outs.append(backend.attend(q, k, v, kv_cache.clone()))
    assert torch.allclose(outs[1], outs[0], atol=1e-5)
