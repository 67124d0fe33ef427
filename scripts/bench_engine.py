"""Benchmark the single-model engine against transformers `generate`.

For each model: tokens/s of (a) our engine with 1 and with 16 concurrent requests and
(b) transformers `generate`, one request at a time; outputs are checked to be equal
(greedy). Also the share of each engine step spent outside the model forward
(scheduling, page tables, sampling) at batch 16; each with torch's linear layers
and with oneDNN-packed ones (`cpu_linear`). Then the decode step cost of the
routing fixtures (small, mid, large) at batch 1 and 16, relative to the small's.
Prints tables, writes JSON.

    .venv/bin/python scripts/bench_engine.py [--models large,m30] [--out bench_results/engine.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.protocol import SamplingParams
from trd.testing.tinymodels.build import ensure_models

PROMPT_LEN, NEW_TOKENS, CONCURRENT = 32, 128, 16


def prompts(n: int) -> list[list[int]]:
    return [[(31 * i + 7 * j) % 1900 + 40 for j in range(PROMPT_LEN)] for i in range(n)]


def run_engine(
    path: Path, n: int, cpu_linear: str = "torch"
) -> tuple[float, list[list[int]], float]:
    engine = Engine(EngineSpec.of(path, dtype="float32", kv_tokens=16384, cpu_linear=cpu_linear))
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    engine.generate(prompts(1), SamplingParams(max_tokens=4))  # warm-up
    engine.runner.model_seconds = 0.0
    start = time.perf_counter()
    outs = engine.generate(prompts(n), params)
    wall = time.perf_counter() - start
    overhead = 1 - engine.runner.model_seconds / wall
    return n * NEW_TOKENS / wall, outs, overhead


def run_transformers(path: Path, n: int) -> tuple[float, list[list[int]]]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generate(torch.tensor(prompts(1)), max_new_tokens=4, do_sample=False)  # warm-up
    outs = []
    start = time.perf_counter()
    for p in prompts(n):
        gen = model.generate(
            torch.tensor([p]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
            do_sample=False, pad_token_id=0,
        )  # fmt: skip
        outs.append(gen[0, len(p) :].tolist())
    wall = time.perf_counter() - start
    return n * NEW_TOKENS / wall, outs


FIXTURES = ("small", "mid", "large")
# Our engine with torch's linear (the default) and with oneDNN-packed weights.
LINEARS = ("torch", "onednn")


def fixture_step_ms() -> dict[str, dict[str, float]]:
    """Mean engine step (ms) of each routing fixture at batch 1 and batch 16."""
    paths = ensure_models(names=FIXTURES)
    return {
        name: {f"b{n}": 1e3 * n / run_engine(paths[name], n)[0] for n in (1, CONCURRENT)}
        for name in FIXTURES
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="large,m30", help="fixture names (default: large,m30)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    ap.add_argument("--out", type=Path, default=Path("bench_results/engine.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    names = args.models.split(",")
    paths = ensure_models(names=names)
    rows = []
    for name in names:
        hf1, ref1 = run_transformers(paths[name], 1)
        hf_seq, ref16 = run_transformers(paths[name], CONCURRENT)
        for linear in LINEARS:
            tps1, out1, _ = run_engine(paths[name], 1, linear)
            tps16, out16, overhead = run_engine(paths[name], CONCURRENT, linear)
            rows.append({
                "model": name,
                "cpu_linear": linear,
                "engine_b1_tok_s": tps1,
                "engine_b16_tok_s": tps16,
                "hf_b1_tok_s": hf1,
                "hf_sequential_tok_s": hf_seq,
                "b1_ratio": tps1 / hf1,
                "b16_vs_hf_sequential": tps16 / hf_seq,
                "overhead_fraction_b16": overhead,
                "outputs_equal": out1 == ref1 and out16 == ref16,
            })  # fmt: skip
    header = f"{'model':6} {'linear':6} {'ours b1':>9} {'hf b1':>9} {'ratio':>6} "
    header += f"{'ours b16':>9} {'hf seq':>9} {'ratio':>6} {'overhead':>8} {'equal':>5}"
    print(f"tokens/s, prompt {PROMPT_LEN}, {NEW_TOKENS} new tokens, {args.threads} threads")
    print(header)
    for r in rows:
        print(
            f"{r['model']:6} {r['cpu_linear']:6} "
            f"{r['engine_b1_tok_s']:9.1f} {r['hf_b1_tok_s']:9.1f} "
            f"{r['b1_ratio']:6.2f} "
            f"{r['engine_b16_tok_s']:9.1f} {r['hf_sequential_tok_s']:9.1f} "
            f"{r['b16_vs_hf_sequential']:6.2f} {r['overhead_fraction_b16']:8.1%} "
            f"{r['outputs_equal']!s:>5}"
        )
    steps = fixture_step_ms()
    print(f"\nfixture decode step, ms (x the small's), {args.threads} threads")
    for name, ms in steps.items():
        cells = [f"b{n} {ms[f'b{n}']:6.2f} ({ms[f'b{n}'] / steps['small'][f'b{n}']:.1f}x)"
                 for n in (1, CONCURRENT)]  # fmt: skip
        print(f"{name:6} " + "   ".join(cells))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"threads": args.threads, "rows": rows, "fixture_step_ms": steps}
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
