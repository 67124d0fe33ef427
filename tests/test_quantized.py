"""Quantised weights: the kernel against its float64 definition, the formats, the GGUF
blocks, the served logits against the float model, routing against the oracle on the
same quantised layers, and what the config and the memory plan make of them."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import ReaderTensor
from gguf.quants import dequantize
from gguf.quants import quantize as quantize_blocks

from trd.config import ConfigError, from_dict
from trd.engines.runner import ModelRunner
from trd.engines.spec import EngineSpec
from trd.memplan.plan import model_mem
from trd.models import qkernel
from trd.models.attention import BatchLayout
from trd.models.checkpoint import read_checkpoint
from trd.models.gguf_quant import gguf_quant
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


def _float64_matmul(layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
    """The kernel's definition, written out: x quantised per row and group of 32 to
    round(x / d) * d with d = max|x| / 127, times the dequantised weights, plus the bias."""
    g = x.double().view(len(x), -1, 32)
    d = g.abs().amax(-1, keepdim=True) / 127
    xq = (torch.round(g / d) * d).view(len(x), -1)
    assert layer.bias is not None
    return xq @ layer.quant().dequantize(torch.float64).T + layer.bias.double()


@needs_kernel
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_computes_its_float64_definition(bits: int, dtype: torch.dtype) -> None:
    """At 1, 4 and 17 rows the kernel's result agrees with a float64 matmul to the output
    dtype's rounding, and a row's result is the same bits whatever else is in its batch;
    the layer's own float64 path (the oracle's) is that matmul."""
    layer = _layer(bits)
    x = (torch.randn(17, 96, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    want = _float64_matmul(layer, x)
    assert torch.allclose(layer(x.double()), want, rtol=1e-12, atol=1e-12)
    full = layer(x)
    tol = 2e-6 if dtype == torch.float32 else 1e-2  # bfloat16 output: 8 bits of mantissa
    for rows in (1, 4, 17):
        part = x[17 - rows :].contiguous()
        got = layer(part)
        assert got.dtype == dtype
        err = (got.double() - want[17 - rows :]).abs().max() / want.abs().max()
        assert err.item() < tol, (rows, err.item())
        assert torch.equal(got, full[17 - rows :]), rows


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


def _random_blocks(kind: T, rows: int, seed: int) -> np.ndarray:
    """Rows of 2 random blocks of `kind` (any bytes are a valid block once its float16
    scales are finite), the scales powers of two so that every product fits float16."""
    rng = np.random.default_rng(seed)
    size, scales = {T.Q4_K: (144, slice(0, 4)), T.Q6_K: (210, slice(208, 210))}[kind]
    data = rng.integers(0, 256, (rows, 2, size), dtype=np.uint8)
    n = (scales.stop - scales.start) // 2
    d = (2.0 ** rng.integers(-12, -6, (rows, 2, n))).astype(np.float16)
    data[..., scales] = d.view(np.uint8).reshape(rows, 2, 2 * n)
    return data.reshape(rows, 2 * size)


@pytest.mark.parametrize(
    "kind,mode,bits,exact",
    [(T.Q4_K, "int4", 4, True), (T.Q8_0, "int8", 8, True), (T.Q8_0, "int4", 8, True),
     (T.Q6_K, "int8", 8, False), (T.Q6_K, "int4", 8, False), (T.Q4_K, "int8", 8, False)],
)  # fmt: skip
def test_gguf_blocks_convert_to_what_gguf_dequantises(
    kind: T, mode: str, bits: int, exact: bool
) -> None:
    """A decoder layer's GGUF matrix in our groups, against gguf's own dequantisation:
    Q4_K (to 4 bits, read from the blocks) and Q8_0 exactly, others within half our step."""
    if kind == T.Q8_0:
        floats = np.random.default_rng(3).standard_normal((16, 512)).astype(np.float32)
        data = quantize_blocks(floats, T.Q8_0)
    else:
        data = _random_blocks(kind, 16, seed=3)
    tensor = cast(ReaderTensor, SimpleNamespace(data=data, tensor_type=kind))
    qt = gguf_quant("model.layers.0.mlp.up_proj", tensor, mode)
    want = torch.from_numpy(dequantize(data, kind))
    got = qt.dequantize()
    assert qt.bits == bits and got.shape == want.shape
    step = qt.scales.float().repeat_interleave(32, dim=1)
    if exact:
        assert torch.equal(got, want)
    else:
        assert ((got - want).abs() <= 0.5 * step + 1e-3 * step).all()


@pytest.fixture(scope="module")
def large(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["large"]


def _prefill_logits(path: Path, dtype: str, quantization: str, ids: list[int]) -> torch.Tensor:
    spec = EngineSpec.of(path, kv_tokens=256, dtype=dtype, quantization=quantization)
    assert spec.settings.quant_dense_from == 0  # the default: the kernel at every row count
    runner = ModelRunner(spec)
    assert quantization == "none" or set(runner.crossover.values()) == {None}
    n = len(ids)
    layout = BatchLayout([n], [0], [list(range(-(-n // 16)))], 16)
    pos = np.arange(n)
    with torch.inference_mode():
        logits, _, _ = runner.run(runner.backend, layout, np.asarray(ids), pos, pos + 1, pos)
    return logits.double()


# Measured on the large fixture, the test's 24 positions (float32 activations): KL(float ||
# quantised) mean int8 3.6e-5, int4 3.7e-4, every greedy token agrees; 4-bit groups with 8
# levels instead of 16 give 1.5e-3.
TOLERANCE = {"int8": 1e-4, "int4": 1e-3}


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
    tensors: dict[str, torch.Tensor] = {}
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
    policy, params = PolicySpec("rstitch", {"threshold": 0.78}), SamplingParams(max_tokens=6)
    stored = ReferenceRouter([q, q], policy).run(ids, params)  # the oracle reads it too
    at_load_ref = ReferenceRouter([large, large], policy, quantization="int4").run(ids, params)
    assert (stored.tokens, stored.models) == (at_load_ref.tokens, at_load_ref.models)


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


@needs_kernel
def test_a_decode_rows_attention_does_not_depend_on_its_batch() -> None:
    """With the native glue a one-token row is attended in the one native call whether the
    batch holds it alone, other decodes, or a prefill too: bit-identical outputs (a
    request's tokens, and the routing decisions on them, must not depend on what it was
    batched with; before, a batch with a prefill sent its decode rows through SDPA)."""
    from trd.models.attention.torch_paged import TorchPagedAttention

    native = qkernel.load()
    assert native is not None
    gen = torch.Generator().manual_seed(7)
    h, kvh, d = 4, 2, 32
    kv_cache = torch.randn(2, 12, 16, kvh, d, generator=gen)
    decode_q = torch.randn(1, h, d, generator=gen)
    decode_kv = torch.randn(2, 1, kvh, d, generator=gen)  # its new token's k and v
    other_q, prefill_q = torch.randn(1, h, d, generator=gen), torch.randn(5, h, d, generator=gen)
    other_kv, prefill_kv = torch.randn(2, 1, kvh, d), torch.randn(2, 5, kvh, d)

    def attend(layout: BatchLayout, q: torch.Tensor, kv: torch.Tensor, row: int) -> torch.Tensor:
        backend = TorchPagedAttention(torch.device("cpu"))
        backend.native = native
        backend.plan(layout)
        return backend.attend(q, kv[0], kv[1], kv_cache.clone())[row]

    decode = ([1], [40], [[3, 0, 7]])  # q_len, tokens before, pages: the same row in each
    alone = attend(BatchLayout(*decode, 16), decode_q, decode_kv, 0)
    batches = [  # another decode first; a prefill of 5 tokens after 9 cached first
        (BatchLayout([1, 1], [20, 40], [[5, 9], [3, 0, 7]], 16), other_q, other_kv),
        (BatchLayout([5, 1], [9, 40], [[5], [3, 0, 7]], 16), prefill_q, prefill_kv),
    ]
    for layout, q, kv in batches:
        got = attend(layout, torch.cat([q, decode_q]), torch.cat([kv, decode_kv], 1), len(q))
        assert torch.equal(got, alone)


def test_bench_step_times_each_variant_and_its_weights(large: Path, tmp_path: Path) -> None:
    """`tokenrouterd bench step` on the fixture: a run per variant and row count in the one
    result schema, each variant's resident weights (int4 below float) and its crossover."""
    from trd.bench import step

    out = tmp_path / "step.json"
    argv = [str(large), "--variants", "float32:none,float32:int4", "--rows", "1,3",
            "--rounds", "1", "--steps", "2", "--threads", "1", "--out", str(out)]  # fmt: skip
    assert step.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "bench step" and result["command"][3:] == argv
    runs = {(r["system"], r["rows"]): r for r in result["runs"]}
    assert set(runs) == {(v, n) for v in ("float32:none", "float32:int4") for n in (1, 3)}
    assert all(len(r["records"]) == 2 and r["summary"]["step_ms_p50"] > 0 for r in runs.values())
    systems = result["systems"]
    assert 0 < systems["float32:int4"]["weight_bytes"] < systems["float32:none"]["weight_bytes"]
    assert systems["float32:none"]["crossover"] == {} and systems["float32:int4"]["crossover"]
    assert "start" in result["machine"] and "end" in result["machine"]


@pytest.mark.slow  # a daemon of its own (~25 s); the per-commit guard is the Wiring test above
def test_the_daemon_serves_a_quantised_pair_token_exact(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """The real daemon (two engine processes, float64, R-Stitch) on a stored int4
    checkpoint beside a float one quantised at load, through the openai client: the
    reference loop's text on the same quantised layers, and both models wrote tokens."""
    from transformers import AutoTokenizer

    from trd.bench import server

    from daemon_fixture import start_daemon

    small = _quantised_copy(tiny_models["small"], tmp_path / "small-int4", "int4")
    paths = {"small": small, "large": tiny_models["large"]}
    policy = {"name": "rstitch", "threshold": 0.78}
    cfg = server.daemon_config(paths, policy, dtype="float64", per_model={"large": {
        "quantization": "int4"}}, engine={"threads": 1, "max_batch_tokens": 512})  # fmt: skip
    d = start_daemon(server.write_config(cfg, tmp_path / "config.yaml"))
    try:
        tok = AutoTokenizer.from_pretrained(small)
        ref = ReferenceRouter(list(paths.values()), PolicySpec("rstitch", {"threshold": 0.78}),
                              quantization="int4")  # fmt: skip
        params = SamplingParams(max_tokens=24, ignore_eos=True)
        producers = set()
        for prompt in ("def parse(", "The quick brown fox"):
            trace = ref.run(tok.encode(prompt), params)
            producers |= set(trace.models)
            resp = d.client().completions.create(
                model=d.model, prompt=prompt, max_tokens=24, temperature=0,
                extra_body={"ignore_eos": True})  # fmt: skip
            assert resp.choices[0].text == tok.decode(trace.tokens), prompt
        assert producers == {0, 1}
        status = {e["name"]: e for e in d.status()["engines"]}  # as the engines report it
        assert status["small"]["quantization"] == status["large"]["quantization"] == "int4"
    finally:
        assert d.stop() == 0, d.log()
