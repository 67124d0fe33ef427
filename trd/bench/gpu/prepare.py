"""The two stages before any measurement, run at once: the checkpoints (GPU and memory
work) and flashinfer's kernels (compilation: CPU work).

    python -m trd.bench.gpu.stage checkpoints CTX OUT.json
    python -m trd.bench.gpu.stage kernels CTX OUT.json

checkpoints  the shaped pair at published depth, bfloat16, drawn on the device
             (trd/testing/shaped.py: 1.2 GB and 16.4 GB for Qwen3-0.6B and -8B), then the
             extra pair's (Qwen2.5-0.5B and -1.5B shapes), into WORK/shaped
kernels      flashinfer's modules for the pairs' head dims (128; 64 for the 0.5B shape),
             compiled into $FLASHINFER_WORKSPACE_BASE, where every engine of the run
             finds them (trd/testing/attention_cases.py `compile_kernels`)
"""

from __future__ import annotations

import time

import torch

from trd.bench.gpu.plan import Ctx
from trd.bench.stages import Partial, log
from trd.testing.attention_cases import compile_kernels
from trd.testing.shaped import write_checkpoint


def keys(ctx: Ctx) -> list[str]:
    return [*ctx.plan.pair, *(ctx.plan.extra_pair or ())]


def checkpoints(ctx: Ctx, out: Partial, args: list[str]) -> bool:
    models = {}
    for key in keys(ctx):
        shape = ctx.plan.shape(key)
        start = time.perf_counter()
        path = write_checkpoint(shape, ctx.shaped, ctx.plan.device)
        models[key] = {"path": str(path), "params": shape.num_params(), "layers": shape.layers,
                       "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip
        out.put("models", models)
        log(f"checkpoint {key}: {models[key]}")
    return True


def kernels(ctx: Ctx, out: Partial, args: list[str]) -> bool:
    dims = sorted({ctx.plan.shape(k).head_dim for k in keys(ctx)})
    backend, dtype = ("torch", torch.float32) if ctx.plan.dry_run else (
        "flashinfer", torch.bfloat16)  # fmt: skip
    seconds = compile_kernels(backend, dtype, ctx.plan.device, dims)
    out.put("compile_s", seconds)
    return len(seconds) == len(dims)
