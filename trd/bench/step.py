"""`tokenrouterd bench step`: the decode-step cost of one model in several variants (dtype x
quantisation), in this process, A/B interleaved.

Each variant is loaded once (`ModelRunner`, as an engine does); then rounds run, each
timing `--steps` decode steps of every variant at every row count in turn (R requests of
`--context` tokens each feed one token), so that a load change on a shared machine hits
every variant alike. Prints the median step (wall and CPU time of this process); writes
the one result schema (`trd.bench.result`) with the machine's load at start and end,
each variant's resident weight bytes and its measured dense crossover.

    tokenrouterd bench step MODEL_DIR [--variants bfloat16:none,float32:int8,float32:int4]
        [--rows 1,16] [--rounds 5] [--steps 10] [--threads 2] [--out FILE]

A variant is DTYPE:QUANTIZATION, or DTYPE:QUANTIZATION@DIR for another checkpoint of the
same model (a quantised import beside its bfloat16 one: QUANTIZATION is then the one the
checkpoint stores).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from trd.bench.result import Result
from trd.engines.runner import ModelRunner
from trd.engines.spec import EngineSpec
from trd.models.attention import BatchLayout


def step(runner: ModelRunner, rows: int, context: int) -> None:
    """One decode step of `rows` requests, each `context` tokens in."""
    pages_per = -(-(context + 1) // runner.page_size)
    pages = [list(range(i * pages_per, (i + 1) * pages_per)) for i in range(rows)]
    layout = BatchLayout([1] * rows, [context] * rows, pages, runner.page_size)
    positions = np.full(rows, context)
    ids = np.arange(rows, dtype=np.int64) + 100
    with torch.inference_mode():
        runner.run(runner.backend, layout, ids, positions, positions + 1, np.arange(rows))


def load_variant(variant: str, model: Path, kv_tokens: int) -> ModelRunner:
    kind, _, path = variant.partition("@")
    dtype, sep, quant = kind.partition(":")
    if not sep:
        raise ValueError(f"--variants: {variant!r} is not DTYPE:QUANTIZATION[@DIR]")
    spec = EngineSpec.of(Path(path) if path else model, kv_tokens=kv_tokens, dtype=dtype,
                         quantization=quant)  # fmt: skip
    return ModelRunner(spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tokenrouterd bench step", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    ap.add_argument("model", type=Path, help="checkpoint folder")
    ap.add_argument("--variants", default="bfloat16:none,float32:int8,float32:int4")
    ap.add_argument("--rows", default="1,16", help="requests per step")
    ap.add_argument("--context", type=int, default=128, help="tokens before the step's")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round and variant")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    command = ["tokenrouterd", "bench", "step", *(sys.argv[3:] if argv is None else argv)]
    out = Result("bench step", command)
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    kv_tokens = max(rows) * (args.context + 32)
    runners = {v: load_variant(v, args.model, kv_tokens) for v in args.variants.split(",")}
    for v, r in runners.items():
        out.system(v, {"weight_bytes": r.weight_bytes, "crossover": r.crossover})
    wall: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for n in rows:
            for v, runner in runners.items():
                step(runner, n, args.context)  # warm
                for _ in range(args.steps):
                    w, c = time.perf_counter(), time.process_time()
                    step(runner, n, args.context)
                    wall.setdefault((v, n), []).append(time.perf_counter() - w)
                    cpu.setdefault((v, n), []).append(time.process_time() - c)
    for (v, n), times in wall.items():
        ms, cpu_ms = 1e3 * statistics.median(times), 1e3 * statistics.median(cpu[v, n])
        out.run({"system": v, "rows": n, "summary": {"step_ms_p50": ms, "cpu_ms_p50": cpu_ms},
                 "records": [1e3 * t for t in times]})  # fmt: skip
        print(f"{v:40s} rows {n:3d} {ms:8.1f} ms  (cpu {cpu_ms:7.1f} ms)")
    out.add(model=str(args.model), threads=args.threads, context=args.context)
    if args.out:
        print(f"wrote {out.write(args.out)}")
    else:
        out.finish()
    start, end = (out.body["machine"][k]["load"][0] for k in ("start", "end"))
    print(f"load average (1 min): {start} at start, {end} at end")
    return 0
