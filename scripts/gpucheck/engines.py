"""Engines on the GPU: float32 refused, graphs on vs off token-equal, step latency, memory.

    python -m gpucheck.engines OUT.json FIXTURES_DIR

1. A float32 engine on CUDA is refused with a clear error, not a crash at its first step.
2. The routed workload (routing.py) on the fixtures (small + large, bf16) and on the
   0.6B/8B-shaped pair, graphs on and off: the tokens must be equal; the shaped pair's
   must also be the tokens its weights make. A mismatch names the request and position.
3. Decode step latency per batch size for each shaped model, graphs on and off.
4. Memory: the graphs' capture against the plan's graph reserve; the process's memory
   outside torch (CUDA context, kernels) against the plan's per-engine constant.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path
from typing import Any

import torch

from gpucheck.common import SHAPED, dump, log
from gpucheck.routing import POLICY, SCHEDULE, expected_tokens, jobs
from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.memplan.plan import CUDA_CONTEXT_BYTES, reserve_bytes
from trd.protocol import FinishReason, SamplingParams
from trd.supervisor.deployment import engine_graphs
from trd.testing.wiring import Wiring

BATCHES = (1, 2, 4, 8, 16, 32, 64)
SPEC = {"dtype": "bfloat16", "device": "cuda", "kv_tokens": 65536, "max_batch_tokens": 2048}


def refuses_float32(path: Path) -> dict[str, Any]:
    try:
        EngineSpec.of(path, device="cuda", dtype="float32")
    except ValueError as exc:
        ok = "flashinfer" in str(exc) and "bfloat16" in str(exc)
        return {"ok": ok, "message": str(exc)}
    return {"ok": False, "message": "a float32 engine on CUDA was accepted"}


def routed(paths: list[Path], graphs: bool) -> tuple[Wiring, list[list[int]], float]:
    start = time.perf_counter()
    pair = Wiring.of(paths, POLICY, cuda_graphs=graphs, **SPEC)
    built = time.perf_counter() - start
    gens = pair.run(jobs())
    bad = [g.error for g in gens if g.finish is FinishReason.ERROR]
    if bad:
        raise RuntimeError(f"requests failed: {bad[:3]}")
    log(f"  graphs {'on ' if graphs else 'off'}: built in {built:.1f} s, "
        f"ran in {time.perf_counter() - start - built:.1f} s")  # fmt: skip
    return pair, [g.tokens for g in gens], built


def first_mismatch(a: list[list[int]], b: list[list[int]]) -> str:
    for rid, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            pos = next((i for i, (s, t) in enumerate(zip(x, y, strict=False)) if s != t), None)
            return f"request {rid} position {pos}: {x[:40]} vs {y[:40]}"
    return ""


def latency(engine: Engine, graphs: bool) -> dict[str, float]:
    """Mean ms of a decode step (forward, sampling, the host copy) at each batch size."""
    out = {}
    for b in BATCHES:
        params = SamplingParams(max_tokens=64, ignore_eos=True)
        rids = [engine.add_request([(5 * i + j) % 2000 + 1 for j in range(32)], params)
                for i in range(b)]  # fmt: skip
        for _ in range(4):  # the prefill (one or two steps), then warm decodes
            engine.step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            engine.step()
        out[str(b)] = round((time.perf_counter() - start) / 10 * 1e3, 3)
        for rid in rids:
            engine.abort(rid)
    log(f"  step ms (graphs {'on' if graphs else 'off'}): {out}")
    return out


def memory(pair: Wiring) -> dict[str, Any]:
    """Graph pools against the plan's graph reserve; memory outside torch's allocator."""
    rows = []
    for node in pair.engines:
        runner, spec = node.engine.runner, node.engine.spec
        cfg, settings = spec.checkpoint.config, spec.settings
        page = cfg.kv_bytes_per_token(spec.dtype) * settings.page_size
        graphs = engine_graphs(settings, "cuda:0", runner.attention)
        planned = reserve_bytes(cfg, "cuda", settings.max_batch_tokens, graphs, page)
        planned -= reserve_bytes(cfg, "cuda", settings.max_batch_tokens)
        measured = runner.graphs.capture_bytes if runner.graphs else 0
        rows.append({"model": spec.name, "graph_bytes": measured, "planned": planned,
                     "ok": measured <= planned})  # fmt: skip
    outside = process_gpu_bytes()
    torch_bytes = torch.cuda.memory_reserved()
    context = None if outside is None else outside - torch_bytes
    ok_ctx = context is None or context <= CUDA_CONTEXT_BYTES
    return {"graphs": rows, "process_bytes": outside, "torch_reserved": torch_bytes,
            "outside_torch": context, "planned_context": CUDA_CONTEXT_BYTES,
            "ok": all(r["ok"] for r in rows) and ok_ctx}  # fmt: skip


def process_gpu_bytes() -> int | None:
    """This process's GPU memory as NVML counts it (None where NVML cannot say)."""
    import os

    import pynvml

    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == os.getpid() and p.usedGpuMemory:
                return int(p.usedGpuMemory)
    except pynvml.NVMLError as exc:
        log(f"  NVML per-process memory unavailable: {exc}")
    return None


def main() -> None:
    out_path, fixtures = sys.argv[1], Path(sys.argv[2])
    result: dict[str, Any] = {"float32_refused": refuses_float32(fixtures / "small")}
    log(f"float32 on CUDA: {result['float32_refused']}")
    pairs = {"fixtures": [fixtures / "small", fixtures / "large"],
             "shaped": [SHAPED["small"], SHAPED["large"]]}  # fmt: skip
    ok = result["float32_refused"]["ok"]
    for name, paths in pairs.items():
        log(f"{name}: routed workload, graphs on and off")
        entry: dict[str, Any] = {}
        try:
            runs = {}
            for graphs in (True, False):
                pair, tokens, built = routed(paths, graphs)
                runs[graphs] = tokens
                entry[f"build_s_graphs_{graphs}"] = round(built, 1)
                if name == "shaped":
                    entry[f"step_ms_graphs_{graphs}"] = {
                        node.engine.spec.name: latency(node.engine, graphs) for node in pair.engines
                    }
                    if graphs:
                        entry["memory"] = memory(pair)
                del pair
                gc.collect()  # runner <-> graphs cycles hold the GPU memory
                torch.cuda.empty_cache()
            entry["equal"] = runs[True] == runs[False]
            entry["mismatch"] = first_mismatch(runs[True], runs[False])
            if name == "shaped":
                want = [expected_tokens(p, sp.max_tokens, SCHEDULE) for p, sp in jobs()]
                entry["as_designed"] = runs[True] == want
                entry["design_mismatch"] = first_mismatch(runs[True], want)
            entry["ok"] = entry["equal"] and entry.get("as_designed", True) and entry.get(
                "memory", {}).get("ok", True)  # fmt: skip
        except Exception as exc:
            entry = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        log(f"{name}: {entry}")
        result[name] = entry
        ok = ok and entry["ok"]
    dump(out_path, {"ok": ok, **result})


if __name__ == "__main__":
    main()
