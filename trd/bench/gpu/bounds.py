"""The bounds a GPU run is judged against, and the stage that measures what they need.

HBM bound. A decode step reads every weight once (the untied input embedding only at its
B rows) and each request's KV: bytes(B, c) = weights read + B x c x KV bytes per token,
time >= bytes / bandwidth. The bandwidth is measured in the run (a device-to-device copy
of 1 GiB, read and write counted: what the HBM delivers to a streaming kernel) and beside
it the device's datasheet figure by name (`SPEC`); the bounds use the measured one, and
the result says so. A run's bound is the sum over the steps its engines ran (counted by
the engines, or by the system's own schedule: one forward per token for the loop, one
step per token for `generate`); fraction = bound / wall.

Batching bound. Each engine's step cost is measured alone at each batch size of the plan
(trd/bench/compare/stepcost.py, graphs on, a context of prompt + half the output). At N
requests and large share s, a round in which every request makes one token runs a step of
the small engine with N - K rows and one of the large with K rows, K ~ Binomial(N, s),
the two in turn on the one GPU: predicted time per round = E[cost_s(N - K) + cost_l(K)]
(cost(0) = 0), throughput = N / that. At N = 1 it is (1 - s) cost_s(1) + s cost_l(1),
the per-token time the routing overhead is judged against. The run-level bound from the
daemon's own counters is stepcost.batching_bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trd.bench.compare.stepcost import calibrate, step_ms
from trd.bench.gpu.plan import Ctx
from trd.bench.stages import Partial, log
from trd.models.checkpoint import dtype_size, read_checkpoint

# Datasheet HBM bandwidth, bytes/s, by a part of the device's name (first match wins).
SPEC = (("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12),
        ("A100-SXM4-80GB", 2.04e12), ("A100", 1.94e12), ("L40S", 0.864e12))  # fmt: skip
COPY_MIB, COPIES = 1024, 20


def spec_bandwidth(name: str) -> float | None:
    return next((bw for part, bw in SPEC if part in name), None)


def measure_bandwidth(device: str, mib: int = COPY_MIB, copies: int = COPIES) -> dict[str, Any]:
    """Bytes/s of a device-to-device copy (read + write), best of `copies`."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(copies + 1):  # the first warms up
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        if device != "cpu":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    name = torch.cuda.get_device_name(0) if device != "cpu" else "cpu"
    measured = 2 * src.numel() / best
    return {"device": name, "measured_bytes_s": measured, "spec_bytes_s": spec_bandwidth(name),
            "used": "measured", "copy_mib": mib}  # fmt: skip


def model_bytes(path: Path, dtype: str) -> dict[str, int]:
    """What a decode step of this model reads: weights (bytes) and KV per token."""
    ckpt = read_checkpoint(path)
    c, size = ckpt.config, dtype_size(dtype)
    embedding = 0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size
    kv = c.num_layers * 2 * c.num_kv_heads * c.head_dim * size
    return {"weights_read": (ckpt.num_params - embedding) * size, "kv_token": kv}


def step_bound_s(mb: Mapping[str, int], batch: float, context: float, bw: float) -> float:
    return (mb["weights_read"] + batch * context * mb["kv_token"]) / bw


def run_bound_s(
    sizes: Mapping[str, Mapping[str, int]], work: Mapping[str, tuple[int, int]],
    context: float, bw: float,
) -> float:  # fmt: skip
    """The HBM bound of the steps a run ran: work = {model: (steps, rows)}."""
    return sum((steps * sizes[m]["weights_read"] + rows * context * sizes[m]["kv_token"]) / bw
               for m, (steps, rows) in work.items())  # fmt: skip


def predicted_round_ms(costs: Mapping[str, Any], n: int, share: float | None) -> float:
    """Expected ms of a round of one token per request (module docstring)."""
    small, large = (costs[m]["decode_ms"] for m in ("small", "large"))
    if share is None:  # the large model alone
        return step_ms(large, n)
    total = 0.0
    for k in range(n + 1):
        p = math.comb(n, k) * share**k * (1 - share) ** (n - k)
        total += p * ((step_ms(small, n - k) if k < n else 0) + (step_ms(large, k) if k else 0))
    return total


def stage(ctx: Ctx, out: Partial, args: list[str]) -> bool:
    """The bandwidth, then each model of the pair alone: its step costs and HBM bounds."""
    plan = ctx.plan
    bw = measure_bandwidth(plan.device, 64 if plan.dry_run else COPY_MIB)
    out.put("bandwidth", bw)
    log(f"bandwidth: {bw}")
    context = plan.prompt_tokens + plan.max_tokens // 2
    batches = sorted({1, *plan.ns})
    models: dict[str, Any] = {}
    for name, path in ctx.pair_paths().items():
        costs = calibrate(path, plan.dtype, context, batches=batches, device=plan.device,
                          cuda_graphs=True)  # fmt: skip
        sizes = model_bytes(path, plan.dtype)
        hbm = [[b, 1e3 * step_bound_s(sizes, b, context, bw["measured_bytes_s"])]
               for b in batches]  # fmt: skip
        models[name] = {**costs, **sizes, "hbm_ms": hbm,
                        "hbm_fraction": [[b, h / ms] for (b, ms), (_, h)
                                         in zip(costs["decode_ms"], hbm, strict=True)]}  # fmt: skip
        out.put("models", models)
        log(f"step cost {name}: {costs['decode_ms']} ms, HBM bound {hbm} ms")
    return True
