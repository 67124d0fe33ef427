"""The attention op against a reference: one layer's KV write and attention, per case.

The cases the GPU review lists, on page size 16 with shuffled page tables: decode only,
prefill from empty, extend on existing KV (start 37, 5 new), decode mixed with extends,
full last pages; for (heads, KV heads, head dim) of the published shapes: Qwen3-0.6B
(16, 8, 128) and -8B (32, 8, 128), the shaped pair's; Qwen3-14B (40, 8, 128), ratio 5;
Qwen2.5-7B (28, 4, 128), ratio 7; Qwen2.5-1.5B (12, 2, 128), ratio 6; Qwen2.5-0.5B
(14, 2, 64), head_dim 64 (the last two: the Qwen2.5-Coder pair's). The reference
is the torch backend on a float32 copy of the same data. Every case is run and printed;
none stops the others. Head dims below 64 have no flashinfer kernels: that such a model
gets the torch backend is checked instead.

flashinfer compiles one module per head dim at first use (about 30 s each on 16 cores):
`compile_kernels` compiles those of the head dims asked for at once, in threads, into
$FLASHINFER_WORKSPACE_BASE, where every later engine of the machine finds them. The GPU
check's attention stage (scripts/gpucheck/attention.py) runs the cases; `bench compare
--plan gpu` compiles the kernels while its checkpoints are written.
"""

from __future__ import annotations

import time
import traceback
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from trd.bench.stages import log
from trd.models.attention import AttentionBackend, BatchLayout, make_backend, resolve_backend
from trd.models.attention.torch_paged import TorchPagedAttention
from trd.models.checkpoint import ModelConfig

PAGE = 16
HEADS = [(16, 8, 128), (32, 8, 128), (40, 8, 128), (28, 4, 128), (12, 2, 128), (14, 2, 64)]
# name: (new tokens per request, tokens already cached per request)
CASES = {
    "decode": ([1, 1, 1, 1], [37, 5, 100, 0]),
    "prefill": ([7, 33, 16], [0, 0, 0]),
    "extend": ([5, 3], [37, 16]),
    "mixed": ([1, 5, 1, 12, 1], [40, 37, 3, 0, 200]),
    "full_last_page": ([1, 8, 16], [31, 40, 16]),  # kv lengths 32, 48, 32: whole pages
}
TOLERANCE = 2e-2  # bf16 output of values of magnitude <= ~2: a few units in the last place


@dataclass
class Problem:
    layout: BatchLayout
    q: torch.Tensor  # (T, H, D)
    k: torch.Tensor  # (T, KVH, D)
    v: torch.Tensor
    cache: torch.Tensor  # (2, pages, PAGE, KVH, D): random contents, old tokens included


def problem(case: str, heads: tuple[int, int, int], dtype: torch.dtype, dev: str) -> Problem:
    q_lens, starts = CASES[case]
    h, kvh, d = heads
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case}{heads}".encode()))
    need = [-(-(s + n) // PAGE) for s, n in zip(starts, q_lens, strict=True)]
    pages = torch.randperm(sum(need) + 5, generator=gen).tolist()  # shuffled, some unused
    tables, at = [], 0
    for n in need:
        tables.append(pages[at : at + n])
        at += n
    t = sum(q_lens)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(dtype).to(dev)

    layout = BatchLayout(q_lens, starts, tables, PAGE)
    return Problem(layout, rand(t, h, d), rand(t, kvh, d), rand(t, kvh, d),
                   rand(2, len(pages), PAGE, kvh, d))  # fmt: skip


def run_one(backend: AttentionBackend, p: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    cache = p.cache.clone()
    backend.plan(p.layout)
    return backend.attend(p.q, p.k, p.v, cache), cache


def compare(backend: AttentionBackend, p: Problem) -> dict[str, float]:
    """Max abs errors of the output and of the written cache against the float32 torch
    backend on the same (upcast) data."""
    out, cache = run_one(backend, p)
    f32 = Problem(p.layout, p.q.float(), p.k.float(), p.v.float(), p.cache.float())
    ref_out, ref_cache = run_one(TorchPagedAttention(p.q.device), f32)
    return {
        "out_err": (out.float() - ref_out).abs().max().item(),
        "kv_err": (cache.float() - ref_cache).abs().max().item(),
    }


def config(heads: tuple[int, int, int]) -> ModelConfig:
    h, kvh, d = heads
    return ModelConfig.from_dict(
        {"model_type": "qwen3", "num_hidden_layers": 1, "num_attention_heads": h,
         "num_key_value_heads": kvh, "head_dim": d, "hidden_size": h * d,
         "intermediate_size": 8, "vocab_size": 8},
        "attention-check",
    )  # fmt: skip


def check_all(backend_name: str, dtype: torch.dtype, dev: str) -> list[dict[str, Any]]:
    rows = []
    for heads in HEADS:
        backend = make_backend(backend_name, torch.device(dev), config(heads), dtype)
        for case in CASES:
            row: dict[str, Any] = {"case": case, "heads": list(heads)}
            start = time.perf_counter()
            try:
                row |= compare(backend, problem(case, heads, dtype, dev))
                row["ok"] = row["out_err"] <= TOLERANCE and row["kv_err"] == 0.0
            except Exception as exc:  # every case runs; the failure is reported
                row |= {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                traceback.print_exc()
            row["seconds"] = round(time.perf_counter() - start, 2)
            log(f"attention {case:15} {heads!s:14} " + (
                f"out {row['out_err']:.2e} kv {row['kv_err']:.1e}" if "out_err" in row
                else row["error"][:200]) + ("" if row["ok"] else "   <-- FAIL"))  # fmt: skip
            rows.append(row)
    return rows


def compile_kernels(
    backend_name: str, dtype: torch.dtype, dev: str, head_dims: Sequence[int] = (64, 128)
) -> dict[str, float]:
    """One decode and one extend per head dim, the head dims in parallel: seconds each."""

    def one(heads: tuple[int, int, int]) -> float:
        start = time.perf_counter()
        backend = make_backend(backend_name, torch.device(dev), config(heads), dtype)
        for case in ("decode", "extend"):
            run_one(backend, problem(case, heads, dtype, dev))
        return round(time.perf_counter() - start, 1)

    first = {h[2]: h for h in reversed(HEADS) if h[2] in head_dims}  # one shape per head dim
    with ThreadPoolExecutor(len(first)) as pool:
        futures = {d: pool.submit(one, h) for d, h in first.items()}
    seconds = {}
    for d, future in futures.items():
        try:
            seconds[str(d)] = future.result()
        except Exception as exc:  # the cases report it again, one by one
            log(f"compiling head_dim {d}: {type(exc).__name__}: {exc}"[:300])
    log(f"kernels ready: {seconds}")
    return seconds


def fallback(dev: str) -> str:
    """The backend `auto` gives a head_dim-32 model (the fixtures'): torch, not a crash."""
    return resolve_backend("auto", torch.device(dev), config((2, 1, 32)), "bfloat16")
