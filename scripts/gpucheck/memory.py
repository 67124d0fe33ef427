"""The memory plan against what the GPU shows, for one engine in its own process (as the
daemon runs them): the 8B-shaped model, graphs on, after a batch of work.

    python -m gpucheck.memory OUT.json

What each side reports, and what is compared:

    nvml       the process's GPU memory per NVML (nvidia-smi's "used" column): torch's
               reserved memory plus everything outside it (the CUDA context, kernel images
               of torch, cuBLAS and flashinfer's JIT module, CUDA-graph executables)
    reserved   torch.cuda.memory_reserved(): weights, KV, workspaces, the graph pool
               and the allocator's cached blocks
    pool       the graphs' private pool: its segments in torch.cuda.memory_snapshot()
    planned    the plan's weights + KV + reserve for this model (trd/memplan/plan.py)

Gates: nvml <= planned (the plan holds the engine: what matters for sharing a GPU), and
pool <= the plan's graph terms (largest graph's activations, output buffers, slack).
Reported, not gated: nvml - reserved against the plan's context + cuBLAS terms (576 MiB).
That difference is not torch's and depends on the driver and on how many kernels were
loaded (lazy loading); the margin that covers it is the eager step's activation reserve,
which a decode-heavy engine rarely fills. Without NVML's per-process figure (some
containers, MPS) the nvml gate is reported as unknown and not failed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from gpucheck.common import DEVICE, DRY_RUN, DTYPE, dump, log, model_path
from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.memplan.plan import CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, model_mem
from trd.protocol import SamplingParams
from trd.supervisor.deployment import engine_graphs

MIB = 1 << 20


def process_gpu_bytes() -> int | None:
    """This process's GPU memory as NVML counts it (None where NVML cannot say)."""
    import pynvml

    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == os.getpid() and p.usedGpuMemory:
                return int(p.usedGpuMemory)
    except pynvml.NVMLError as exc:
        log(f"NVML per-process memory unavailable: {exc}")
    return None


def planned(engine: Engine) -> dict[str, int]:
    spec, runner = engine.spec, engine.runner
    s = spec.settings
    shapes = engine_graphs(s, "cuda:0", runner.attention)
    with_graphs = model_mem(spec.name, spec.checkpoint, spec.dtype, "cuda:0", s.max_batch_tokens,
                            shapes, s.page_size, runner.attention)  # fmt: skip
    no_graphs = model_mem(spec.name, spec.checkpoint, spec.dtype, "cuda:0", s.max_batch_tokens,
                          (), s.page_size, runner.attention)  # fmt: skip
    kv = spec.kv_pages * s.page_size * with_graphs.kv_bytes_per_token
    return {"total": with_graphs.weight_bytes + kv + with_graphs.reserve_bytes,
            "graphs": with_graphs.reserve_bytes - no_graphs.reserve_bytes}  # fmt: skip


def main() -> None:
    spec = EngineSpec.of(model_path("large"), dtype=DTYPE, device=DEVICE, kv_tokens=65536)
    engine = Engine(spec)
    count, length = (2, 20) if DRY_RUN else (32, 200)
    prompts = [[(7 * i + j) % 2000 + 1 for j in range(length)] for i in range(count)]
    engine.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    if DRY_RUN:  # nothing on a device to measure: the code above ran
        dump(sys.argv[1], {"ok": True, "dry_run": "no device memory to measure"})
        return
    torch.cuda.synchronize()
    plan = planned(engine)
    graphs = engine.runner.graphs
    nvml, reserved = process_gpu_bytes(), torch.cuda.memory_reserved()
    pool = graphs.capture_bytes if graphs else 0
    outside = None if nvml is None else nvml - reserved
    row: dict[str, Any] = {
        "nvml_mib": None if nvml is None else round(nvml / MIB),
        "planned_mib": round(plan["total"] / MIB),
        "reserved_mib": round(reserved / MIB),
        "pool_mib": round(pool / MIB),
        "planned_graphs_mib": round(plan["graphs"] / MIB),
        "outside_torch_mib": None if outside is None else round(outside / MIB),
        "planned_outside_mib": round((CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES) / MIB),
        "nvml_within_plan": None if nvml is None else nvml <= plan["total"],
        "pool_within_plan": pool <= plan["graphs"],
    }
    log(f"memory: {row}")
    ok = row["pool_within_plan"] and row["nvml_within_plan"] is not False
    dump(sys.argv[1], {"ok": ok, **row})


if __name__ == "__main__":
    main()
