"""The native decode step (trd/models/native_stack.py, cpu_stack.cpp): a step of one-token
rows or a handoff's suffix through it gives bit for bit the hidden states, logits and KV
the modules give, with q/k/v and gate/up fused or separate; a suffix's tokens attend
causally, as SDPA's prefill of a prompt does; a decode row's bits do not depend on whether its step
took the stack or held a prefill (modules); the models it must refuse are refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trd.engines.runner import ModelRunner
from trd.engines.spec import EngineSpec
from trd.models import qkernel
from trd.models import quantize as quantize_module
from trd.models.attention import BatchLayout
from trd.models.attention.torch_paged import TorchPagedAttention
from trd.models.model import DecoderLayer
from trd.testing.tinymodels.build import save_random_checkpoint

pytestmark = pytest.mark.skipif(qkernel.why_not() is not None, reason=str(qkernel.why_not()))

PAGE = 16


def _runner(path: Path, dtype: str = "float32", quantization: str = "int4") -> ModelRunner:
    return ModelRunner(EngineSpec.of(path, kv_tokens=512, dtype=dtype, quantization=quantization,
                                     page_size=PAGE))  # fmt: skip


def _checkpoint(tmp_path: Path, arch: str = "qwen2") -> Path:
    # Distinct biases and norms (the random ones start at 0 and 1): a dropped or misplaced
    # one shows in the logits.
    from safetensors.torch import load_file, save_file

    path = save_random_checkpoint(arch, tmp_path / arch, seed=11, tie_word_embeddings=False)  # type: ignore[arg-type]
    weights = load_file(path / "model.safetensors")
    gen = torch.Generator().manual_seed(12)
    save_file({k: v + torch.randn(v.shape, generator=gen) if v.dim() == 1 else v
               for k, v in weights.items()}, str(path / "model.safetensors"))  # fmt: skip
    return path


def _step(
    runner: ModelRunner, layout: BatchLayout, ids: list[int], stack: bool
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Logits and hidden state of every request's last token, and the KV caches after."""
    kept = runner.stack
    runner.stack = kept if stack else None
    positions = np.concatenate([np.arange(s, s + n) for s, n in
                                zip(layout.kv_starts, layout.q_lens, strict=True)])  # fmt: skip
    last = np.cumsum(layout.q_lens) - 1
    try:
        with torch.inference_mode():
            logits, hidden, _ = runner.run(runner.backend, layout, np.asarray(ids), positions,
                                           positions + 1, last)  # fmt: skip
    finally:
        runner.stack = kept
    return logits, hidden, [c.clone() for c in runner.kv_caches]


def _backend(runner: ModelRunner) -> TorchPagedAttention:
    assert isinstance(runner.backend, TorchPagedAttention)
    return runner.backend


def _fill_cache(runner: ModelRunner, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    for cache in runner.kv_caches:
        cache.copy_(torch.randn(cache.shape, generator=gen))
    return [c.clone() for c in runner.kv_caches]


def _restore(runner: ModelRunner, snapshot: list[torch.Tensor]) -> None:
    for cache, kept in zip(runner.kv_caches, snapshot, strict=True):
        cache.copy_(kept)


@pytest.mark.parametrize("fused", [True, False])
def test_a_decode_step_through_the_stack_is_the_modules_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fused: bool
) -> None:
    if not fused:  # q, k, v and gate, up as separate weights: the stack's other layout
        monkeypatch.setattr(quantize_module, "fuse_layers", lambda model: None)
    runner = _runner(_checkpoint(tmp_path))
    assert runner.stack is not None
    layer = runner.model.model.layers[0]
    assert isinstance(layer, DecoderLayer)
    assert (layer.self_attn.qkv_proj is not None) == fused
    snapshot = _fill_cache(runner, seed=1)
    # Three requests at different lengths, pages out of order and shared by none.
    layout = BatchLayout([1, 1, 1], [40, 9, 33], [[3, 0, 7], [5], [1, 2, 6]], PAGE)
    stacked = _step(runner, layout, [7, 20, 41], stack=True)
    assert _backend(runner).native_decode() is not None  # the step took the stack
    _restore(runner, snapshot)
    modules = _step(runner, layout, [7, 20, 41], stack=False)
    assert torch.equal(stacked[0], modules[0])
    assert torch.equal(stacked[1], modules[1])
    assert all(torch.equal(a, b) for a, b in zip(stacked[2], modules[2], strict=True))
    assert not torch.equal(stacked[2][0], snapshot[0])  # the step wrote its KV


def test_a_decode_rows_bits_are_the_same_beside_a_prefill(tmp_path: Path) -> None:
    """The same decode rows alone (the stack) and in a step with a 6-token prefill of a
    prompt (the modules): identical logits, so routing on them cannot depend on the
    batch."""
    runner = _runner(_checkpoint(tmp_path))
    snapshot = _fill_cache(runner, seed=2)
    # Eight decode rows, pages 0..23 theirs. A last-bit difference before a quantised
    # projection shows in its output only where it flips a rounding: the hidden states
    # (after the last residual add) show it where the logits may not.
    starts = [40, 9, 33, 17, 44, 2, 25, 47]
    pages = [list(range(3 * i, 3 * i + 3)) for i in range(8)]
    ids = [9, 30, 50, 7, 88, 3, 61, 19]
    alone = _step(runner, BatchLayout([1] * 8, starts, pages, PAGE), ids, stack=True)
    assert _backend(runner).native_decode() is not None  # the step took the stack
    _restore(runner, snapshot)
    prefill = list(range(11, 17))  # a prompt's 6 tokens after 4 cached, on page 24
    layout = BatchLayout([6] + [1] * 8, [4, *starts], [[24], *pages], PAGE, [20, *starts])
    mixed = _step(runner, layout, prefill + ids, stack=True)
    assert _backend(runner).native_decode() is None  # this one went through the modules
    assert torch.equal(mixed[0][1:], alone[0])
    assert torch.equal(mixed[1][1:], alone[1])  # the hidden states the policies read too


def _all_rows(runner: ModelRunner, layout: BatchLayout, ids: list[int]) -> torch.Tensor:
    """The logits of every token of the step (the stack where the plan allows it)."""
    positions = np.concatenate([np.arange(s, s + n) for s, n in
                                zip(layout.kv_starts, layout.q_lens, strict=True)])  # fmt: skip
    with torch.inference_mode():
        logits, _, _ = runner.run(runner.backend, layout, np.asarray(ids), positions,
                                  positions + 1, np.arange(len(ids)))  # fmt: skip
    return logits


def test_a_handoff_suffix_takes_the_stack_token_by_token_and_causally(tmp_path: Path) -> None:
    """A handoff's suffix (3 output tokens) beside a decode row: through the stack, bit for
    bit the modules; each token attends to its causal prefix only (its logits are those of
    the same token fed alone after the ones before it, so cutting a feed into steps changes
    no bit), and the whole agrees with SDPA's prefill attention, which the same 3 tokens of
    a prompt keep, to float32 rounding."""
    runner = _runner(_checkpoint(tmp_path))
    snapshot = _fill_cache(runner, seed=4)
    pages = [[4, 2], [7]]
    layout = BatchLayout([3, 1], [21, 9], pages, PAGE, [20, 5])  # outputs from 20 and 5
    ids = [5, 17, 29, 41]
    stacked = _step(runner, layout, ids, stack=True)
    assert _backend(runner).native_decode() is not None  # the step took the stack
    _restore(runner, snapshot)
    modules = _step(runner, layout, ids, stack=False)
    assert torch.equal(stacked[0], modules[0]) and torch.equal(stacked[1], modules[1])
    assert all(torch.equal(a, b) for a, b in zip(stacked[2], modules[2], strict=True))
    _restore(runner, snapshot)
    feed = _all_rows(runner, BatchLayout([3], [21], pages[:1], PAGE, [20]), ids[:3])
    for i in range(3):  # token i alone, after the tokens before it
        _restore(runner, snapshot)
        if i:
            _all_rows(runner, BatchLayout([i], [21], pages[:1], PAGE, [20]), ids[:i])
        alone = _all_rows(runner, BatchLayout([1], [21 + i], pages[:1], PAGE, [20]),
                          ids[i : i + 1])  # fmt: skip
        assert torch.equal(feed[i], alone[0]), i
    _restore(runner, snapshot)
    prompt = _all_rows(runner, BatchLayout([3], [21], pages[:1], PAGE, [30]), ids[:3])
    assert _backend(runner).native_decode() is None  # a prompt's tokens: SDPA
    assert torch.allclose(feed, prompt, rtol=1e-4, atol=1e-4)
    assert not torch.equal(feed, prompt[[1, 0, 2]])  # the tokens' logits differ


def test_the_stack_refuses_what_it_cannot_compute(tmp_path: Path) -> None:
    """Not quantised, not float32, q/k norms (Qwen3): the modules, as before."""
    path = _checkpoint(tmp_path)
    assert _runner(path, quantization="none").stack is None
    assert _runner(path, dtype="float64").stack is None
    assert _runner(path, dtype="bfloat16").stack is None
    assert _runner(_checkpoint(tmp_path, "qwen3")).stack is None


def test_silu_times_up_matches_torch() -> None:
    native = qkernel.load()
    assert native is not None
    gen = torch.Generator().manual_seed(3)
    gate_up = torch.randn(3, 2 * 52, generator=gen) * 30  # past e^88 both ways; a tail of 4
    gate, up = gate_up.chunk(2, dim=-1)
    want = F.silu(gate) * up
    assert torch.allclose(native.silu_mul(gate, up), want, rtol=1e-6, atol=1e-6)
    assert torch.allclose(native.silu_mul(gate.contiguous(), up.contiguous()), want,
                          rtol=1e-6, atol=1e-6)  # fmt: skip
    assert torch.isfinite(native.silu_mul(gate, up)).all()
