"""`tokenrouterd train-router`: train the citer, r2r and collm router heads for one
small/large pair, on CPU.

    tokenrouterd train-router --small models/small --large models/large --out routers/mine
    tokenrouterd train-router --pair demo --out routers/demo

What it needs: the pair's two checkpoint folders (one tokenizer), or --pair for the demo or
fixture pair; prompts (--prompts: code, the 96 small coding tasks the project writes, the
default for --pair demo; chat, 64 written questions, the default for other pairs; magpie,
questions the large model writes itself; corpus for the fixture pair). None is a HumanEval
problem (`tokenrouterd eval humaneval` judges the heads there).
What it writes: OUT/{citer,r2r,collm}.safetensors, each with the pair's identity (another
pair refuses them) and the threshold chosen for it (used when the config gives none), and
OUT/training.json with every count, wall and CPU time per phase. Serve one with
`policy: {name: r2r, head: OUT/r2r.safetensors}`.
How long: the demo pair (Qwen2.5-Coder-0.5B + 1.5B-Instruct, bfloat16), 96 code prompts x
64 tokens, 128 r2r continuations, 2 threads: 194 s of wall time and 374 CPU seconds on
a quiet 2-core machine (2026-12-04: the 1.5B answers 104 s, the 0.5B teacher-forced 50,
132 continuations 30, the heads 5, loading 4). On one that other jobs kept at load
average 7-9 it took 852 CPU seconds and 29 minutes of wall time (training.json keeps
wall and CPU time per phase). The large model's forwards are most of it: the time grows
with --num-prompts, --max-tokens and --continuations. The fixture pair, 64 corpus
prompts: seconds.

Data (trd/routers/data.py): the large model answers the training prompts (greedy, our
Engine, all prompts in one batch, the pair's stored dtype) and gives its top-20
log-probabilities at every answer position; the small model is teacher-forced over each
prompt + answer (4 answers per forward), and each answer position gives its hidden state,
top-100 logits, greedy token and that token's embedding, and the logits' features citer
and collm read beside the hidden state (top-20 log-probabilities, R-Stitch's and
GlimpRouter's entropies). Labels: citer, collm: the small model's greedy token is wrong,
i.e. the large model (the teacher, right on its own answer) finds it at least 10x less
likely than its own token (read from its top 20; beyond them, the 20th's log-probability
bounds it); r2r: a mismatch whose greedy large-model continuation to the end of the
sentence (or 32 tokens) differs from the one after the large model's own token.

Training (trd/routers/fit.py): BCE with pos_weight = negatives/positives; the threshold is
R2R's: on held-out prompts, the lowest large-token share at recall >= 0.95.
Prompts: trd/routers/prompts.py; none shared with the chat prompts that
`tokenrouterd eval routing` judges heads on.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from trd.policies.heads import save_head
from trd.policies.pair import PairIdentity
from trd.routers import data
from trd.routers.fit import fit
from trd.routers.pairs import resolve_pair
from trd.routers.prompts import CODE_PROMPTS, prompts

DEFAULT_PROMPTS = {"code": len(CODE_PROMPTS), "magpie": 512}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="tokenrouterd train-router",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--pair", choices=("demo", "tiny"), help="a known pair (else --small/--large)")
    ap.add_argument("--small", type=Path, help="small model checkpoint folder")
    ap.add_argument("--large", type=Path, help="large model checkpoint folder")
    ap.add_argument("--prompts", choices=("chat", "code", "magpie", "corpus"),
                    help="prompt source (default: corpus for --pair tiny, code for "
                         "--pair demo, else chat)")  # fmt: skip
    ap.add_argument("--num-prompts", type=int,
                    help="training prompts (default: all 96 for code, 512 for magpie, "
                         "else 64)")  # fmt: skip
    ap.add_argument("--max-tokens", type=int, default=64, help="answer length (default 64)")
    ap.add_argument(
        "--continuations",
        type=int,
        default=128,
        help="r2r: about this many large-model continuations (default 128)",
    )
    ap.add_argument("--epochs", type=int, default=40, help="head training epochs (default 40)")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"),
                    help="the models' dtype (default: the large checkpoint's stored one, "
                         "as served)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="torch threads (default: every core)")  # fmt: skip
    ap.add_argument(
        "--cpu-linear",
        choices=("onednn", "torch"),
        help="the large model's CPU linears in our Engine (default: onednn in float32, "
        "which it needs; torch in bfloat16)",
    )
    ap.add_argument(
        "--out", type=Path, required=True, help="folder for the heads and training.json"
    )
    args = resolve_pair(ap, ap.parse_args(argv), train=True)
    if args.num_prompts is None:
        args.num_prompts = DEFAULT_PROMPTS.get(args.prompts, 64)
    args.dtype = args.dtype or data.stored_dtype(args.large)
    args.cpu_linear = args.cpu_linear or ("onednn" if args.dtype == "float32" else "torch")
    return args


def train(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0, c0 = time.perf_counter(), time.process_time()
    load = os.getloadavg()
    times: dict[str, float] = {}
    cpu: dict[str, float] = {}  # CPU seconds, all threads: what a busy machine cannot inflate

    def lap(name: str) -> None:
        times[name] = round(time.perf_counter() - t0 - sum(times.values()), 2)
        cpu[name] = round(time.process_time() - c0 - sum(cpu.values()), 2)
        print(f"{name}: {times[name]:.1f} s ({cpu[name]:.0f} CPU s)", flush=True)

    ps = prompts(args.prompts, args.small, args.num_prompts, args.large)
    lap("prompts")
    engine = data.large_engine(args.large, args.cpu_linear, args.dtype, ps, args.max_tokens)
    lap("large loaded")
    answers = data.answer(engine, ps, args.max_tokens)
    lap("large answers")
    pos = data.teacher_force(args.small, ps, answers.tokens, args.dtype)
    data.label_wrong(answers, pos)
    lap("small teacher-forced")
    continued = data.label_divergence(engine, ps, answers.tokens, pos, args.continuations)
    lap("r2r continuations")
    args.out.mkdir(parents=True, exist_ok=True)
    pair = PairIdentity.of(args.small, args.large)
    summary: dict[str, Any] = {
        "small": str(args.small), "large": str(args.large), "pair": pair.pair,
        "prompts": len(ps), "prompt_source": args.prompts, "answer_tokens": len(pos.small),
        "max_tokens": args.max_tokens, "dtype": args.dtype, "threads": args.threads,
        "mismatches": int(pos.mismatch.sum()),
        "wrong": int(pos.labels("citer").sum()), "continuations": continued,
        "divergent": int((pos.divergent == 1).sum()), "heads": {},
    }  # fmt: skip
    for kind in ("citer", "r2r", "collm"):
        fitted = fit(kind, pos, args.epochs)
        top_k = pos.top_k(kind)
        path = save_head(args.out / f"{kind}.safetensors", kind, fitted.layers, top_k,
                         fitted.threshold, pair, fitted.report)  # fmt: skip
        summary["heads"][kind] = {"path": str(path), "threshold": fitted.threshold,
                                  **fitted.report}  # fmt: skip
        r = fitted.report
        print(
            f"{kind}: threshold {fitted.threshold:.4f}, held-out recall "
            f"{r['heldout_recall']:.3f} at large share {r['heldout_large_share']:.3f} "
            f"(entropy rule: {r['entropy_rule_share_at_same_recall']:.3f})",
            flush=True,
        )
    lap("training")
    summary["seconds"] = {**times, "total": round(time.perf_counter() - t0, 2)}
    summary["cpu_seconds"] = {**cpu, "total": round(time.process_time() - c0, 2)}
    summary["load_average"] = {"start": load, "end": os.getloadavg()}
    (args.out / "training.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {args.out}: {', '.join(summary['heads'])} heads, training.json; "
          f"{summary['seconds']['total']:.0f} s", flush=True)  # fmt: skip
    return summary


def main(argv: list[str] | None = None) -> int:
    train(argv)
    return 0
