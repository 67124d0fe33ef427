"""Decode-step cost of one model in several variants (dtype x quantisation), A/B interleaved.

Each variant is loaded once (`ModelRunner`, as an engine does); then rounds run, each
timing `--steps` decode steps of every variant at every row count in turn (R requests of
`--context` tokens each feed one token), so that a load change on a shared machine hits
every variant alike. Prints the median step (wall and CPU time of this process), writes
JSON with the machine's load average.

    python scripts/bench_step.py MODEL_DIR [--variants bfloat16:none,bfloat16:int4]
        [--rows 1,4,16] [--rounds 5] [--steps 10] [--threads 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from trd.engines.runner import ModelRunner
from trd.engines.spec import EngineSpec
from trd.models.attention import BatchLayout


def step(runner: ModelRunner, rows: int, context: int) -> None:
    pages_per = -(-(context + 1) // runner.page_size)
    pages = [list(range(i * pages_per, (i + 1) * pages_per)) for i in range(rows)]
    layout = BatchLayout([1] * rows, [context] * rows, pages, runner.page_size)
    positions = np.full(rows, context)
    ids = np.arange(rows, dtype=np.int64) + 100
    with torch.inference_mode():
        runner.run(runner.backend, layout, ids, positions, positions + 1, np.arange(rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--variants", default="bfloat16:none,bfloat16:int4")
    p.add_argument("--rows", default="1,4,16")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    kv_tokens = max(rows) * (args.context + 32)
    runners = {}
    for v in args.variants.split(","):
        dtype, quant = v.split(":")
        spec = EngineSpec.of(args.model, kv_tokens=kv_tokens, dtype=dtype, quantization=quant)
        runners[v] = ModelRunner(spec)
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    loads = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for r in rows:
            for v, runner in runners.items():
                step(runner, r, args.context)  # warm
                for _ in range(args.steps):
                    w, c = time.perf_counter(), time.process_time()
                    step(runner, r, args.context)
                    wall.setdefault(f"{v}@{r}", []).append(time.perf_counter() - w)
                    cpu.setdefault(f"{v}@{r}", []).append(time.process_time() - c)
        loads.append(os.getloadavg()[0])
    result = {
        "model": str(args.model), "threads": args.threads, "context": args.context,
        "load_avg_1m": loads, "cpus": os.cpu_count(),
        "median_ms": {k: 1e3 * statistics.median(t) for k, t in wall.items()},
        "median_cpu_ms": {k: 1e3 * statistics.median(t) for k, t in cpu.items()},
    }  # fmt: skip
    for key, ms in result["median_ms"].items():
        print(f"{key:28s} {ms:8.1f} ms  (cpu {result['median_cpu_ms'][key]:7.1f} ms)")
    print(f"load average (1 min) during the run: {min(loads):.1f} .. {max(loads):.1f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
