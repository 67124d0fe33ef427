"""One engine, CUDA graphs on vs off: the same greedy tokens, and the tokens its weights make.

    python -m gpucheck.engines OUT.json

1. A float32 engine on CUDA is refused with a clear error, not a crash at its first step.
2. The 8B-shaped model (its LM head writes the current token + 1) generates 16 requests
   at once, prompts of 3..130 tokens (chunks and eager steps as well as every kind of
   graph bucket), graphs on and off: the tokens must be equal, token for token (greedy,
   and the shaped weights leave margins far above bf16's rounding), and equal to the
   designed ones. A mismatch names the request and position.
3. The same for the demo pair's shapes (Qwen2 with attention biases, head_dim 64 and
   128): the 0.5B-shaped (tied: it repeats the current token) and the 1.5B-shaped.
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

import torch

from gpucheck.common import (
    DEVICE,
    DRY_RUN,
    DTYPE,
    dump,
    first_mismatch,
    log,
    model_path,
    shapes,
)
from trd.engines.engine import Engine
from trd.engines.graphs import StepGraphs
from trd.engines.spec import EngineSpec
from trd.protocol import SamplingParams
from trd.testing.tinymodels.tokenizer import VOCAB_SIZE

PARAMS = SamplingParams(max_tokens=8 if DRY_RUN else 24, ignore_eos=True)


def prompts() -> list[list[int]]:
    return [[(5 * i + 3 * j) % (VOCAB_SIZE - 1) + 1 for j in range(3 + (i * 37) % 128)]
            for i in range(6 if DRY_RUN else 16)]  # fmt: skip


def designed(prompt: list[int], n: int, step: int) -> list[int]:
    """An untied shaped head (step 1) writes the previous token + 1, a tied one (step 0)
    repeats it."""
    return [(prompt[-1] + k * step) % VOCAB_SIZE for k in range(1, n + 1)]


def refuses_float32() -> dict[str, Any]:
    try:
        EngineSpec.of(model_path("large"), device="cuda", dtype="float32")
    except ValueError as exc:
        ok = "flashinfer" in str(exc) and "bfloat16" in str(exc)
        return {"ok": ok, "message": str(exc)}
    return {"ok": False, "message": "a float32 engine on CUDA was accepted"}


def generate(which: str, graphs: bool) -> tuple[list[list[int]], dict[str, Any]]:
    start = time.perf_counter()
    spec = EngineSpec.of(model_path(which), dtype=DTYPE, device=DEVICE, kv_tokens=16384,
                         cuda_graphs=graphs)  # fmt: skip
    engine = Engine(spec)
    if DRY_RUN and graphs:  # the graphs' padding and buffers, run eagerly (no capture)
        engine.runner.graphs = StepGraphs(engine.runner, spec.settings, capture=False)
    built = time.perf_counter() - start
    tokens = engine.generate(prompts(), PARAMS)
    g = engine.runner.graphs
    info = {"attention": engine.runner.attention, "build_s": round(built, 1),
            "run_s": round(time.perf_counter() - start - built, 2),
            "replays": g.used.total() if g else 0, "eager_steps": g.eager_steps if g else None,
            "pool_mib": round(g.capture_bytes / 2**20, 1) if g else None}  # fmt: skip
    log(f"{which}, graphs {'on ' if graphs else 'off'}: {info}")
    del engine, g
    gc.collect()  # runner <-> graphs cycles hold the GPU memory
    if not DRY_RUN:
        torch.cuda.empty_cache()
    return tokens, info


def check(which: str) -> dict[str, Any]:
    """One model, graphs on and off: equal, as designed, and the graphs replayed."""
    runs: dict[bool, list[list[int]]] = {}
    result: dict[str, Any] = {}
    for graphs in (True, False):
        runs[graphs], result[f"graphs_{'on' if graphs else 'off'}"] = generate(which, graphs)
    step = 0 if shapes()[which].tied else 1
    want = [designed(p, PARAMS.max_tokens, step) for p in prompts()]
    result["equal"] = runs[True] == runs[False]
    result["mismatch"] = first_mismatch(runs[True], runs[False])
    result["as_designed"] = runs[True] == want
    result["design_mismatch"] = first_mismatch(runs[True], want)
    used = result["graphs_on"]["replays"] > 0
    return {"ok": result["equal"] and result["as_designed"] and used, **result}


def main() -> None:
    result: dict[str, Any] = {}
    ok = True
    if not DRY_RUN:
        result["float32_refused"] = refuses_float32()
        ok = result["float32_refused"]["ok"]
    result |= check("large")
    ok = ok and result["ok"]
    for which in ("qwen2-small", "qwen2-large"):
        result[which] = check(which)
        ok = ok and result[which]["ok"]
    dump(sys.argv[1], {**result, "ok": ok})


if __name__ == "__main__":
    main()
