"""`tokenrouterd eval routing`: quality against cost of every routing policy on one pair,
threshold sweeps -> a result JSON, plots, a table.

    tokenrouterd eval routing --pair demo --heads routers/demo --out quality/demo
    tokenrouterd eval routing --pair tiny --heads routers/tiny --out quality/tiny

Curves: the entropy rule (rstitch), GlimpRouter (glimp), the trained citer/r2r/collm heads
(from `tokenrouterd train-router --out`) and untrained heads of the same shapes (seeded,
written to OUT/random/). Reference points: large-only and small-only. Every point runs
the evaluation prompts (none of them seen in training) on real engine processes at
concurrency --concurrency, greedy; measures in sweep.py.

Sweep points: each policy's thresholds are the quantiles of its score over the small
model teacher-forced on the large-only answers that escalate --shares of the positions
(an offline estimate: the measured share is what the plots use).

Writes OUT/quality.json (the one result schema, trd/bench/result.py: command, commit,
machine load at start and end; its runs are the sweep's points),
OUT/quality_{identical,nll,handoffs_per_req,tok_s}.png and
OUT/quality_table.md (identical fraction and NLL of each curve at equal large shares; and
offline, on the same teacher-forced positions, the share of positions each score must
escalate to catch 95% of the small model's mismatches: lower is a better ranking).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from trd.bench.result import Result
from trd.evals.routing.judging import judging_prompts
from trd.evals.routing.report import offline_table, plot, table
from trd.evals.routing.sweep import Job, Judge, run, sweep
from trd.evals.routing.sweep import group_for as start_group
from trd.policies.heads import load_head, save_random_head
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.routers import data
from trd.routers.fit import recall_threshold
from trd.routers.pairs import resolve_pair

KINDS = ("citer", "r2r", "collm")
CURVES = ("entropy", "glimp", *KINDS, "random")  # --curves: random = the untrained heads
TABLE_SHARES = (0.1, 0.2, 0.3, 0.4)  # the equal-share table's columns, refined toward


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="tokenrouterd eval routing", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    ap.add_argument("--pair", choices=("demo", "tiny"), help="a known pair (else --small/--large)")
    ap.add_argument("--small", type=Path)
    ap.add_argument("--large", type=Path)
    ap.add_argument("--heads", type=Path, required=True, help="train-router's --out folder")
    ap.add_argument("--prompts", choices=("chat", "written", "corpus"),
                    help="default: corpus for --pair tiny, else chat (the bench's 32 chat "
                         "prompts); written: those and the 64 chat training prompts, for "
                         "heads not trained on them")  # fmt: skip
    ap.add_argument("--curves", default=",".join(CURVES),
                    help=f"which curves to sweep (default all: {','.join(CURVES)})")  # fmt: skip
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument(
        "--shares",
        default="0.1,0.2,0.3,0.45",
        help="escalated fractions the sweep points aim at (offline estimate)",
    )
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--cpu-linear", choices=("onednn", "torch"), default="onednn")
    ap.add_argument("--out", type=Path, required=True)
    args = resolve_pair(ap, ap.parse_args(argv))
    unknown = set(args.curves.split(",")) - set(CURVES)
    if unknown:
        ap.error(f"--curves: unknown {', '.join(sorted(unknown))}; choose from {', '.join(CURVES)}")
    if args.prompts == "written" and heads_prompt_source(args.heads) == "chat":
        ap.error(f"--prompts written: the heads in {args.heads} were trained on chat prompts")
    return args


def heads_prompt_source(heads: Path) -> str | None:
    """The prompt source train-router recorded for the heads (None: no training.json)."""
    path = heads / "training.json"
    return json.loads(path.read_text()).get("prompt_source") if path.is_file() else None


def quantile_taus(score: torch.Tensor, shares: list[float], low_escalates: bool) -> list[float]:
    """Thresholds escalating about each share of the positions."""
    qs = shares if low_escalates else [1 - s for s in shares]
    return sorted(float(torch.quantile(score.double(), q)) for q in qs)


def head_scores(path: Path, kind: str, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return load_head(path, kind)(x)


def curves(
    args: argparse.Namespace,
    pos: data.Positions,
    shares: list[float],
    wanted: frozenset[str] = frozenset(CURVES),
) -> list[Any]:
    """(label, policy spec, thresholds, escalation score per position) of each wanted
    curve (names as in --curves); the untrained heads are written only when swept."""
    out: list[Any] = []
    if "entropy" in wanted:
        out.append(("entropy rule", PolicySpec("rstitch"),
                    quantile_taus(pos.entropy, shares, False), pos.entropy))  # fmt: skip
    if "glimp" in wanted:
        out.append(("glimp", PolicySpec("glimp"), quantile_taus(pos.probe, shares, False),
                    pos.probe))  # fmt: skip
    random_dir = args.out / "random"
    for seed, kind in enumerate(KINDS, start=1):
        x = pos.features(kind).float()
        heads = [(f"{kind} trained", args.heads / f"{kind}.safetensors")] if kind in wanted else []
        if "random" in wanted:
            random_dir.mkdir(parents=True, exist_ok=True)
            rand = save_random_head(random_dir / f"{kind}.safetensors", kind, x.shape[1], 128,
                                    seed, pos.top_k(kind))  # fmt: skip
            heads.append((f"random {kind}", rand))
        for label, path in heads:
            score = head_scores(path, kind, x)
            taus = quantile_taus(score, shares, kind == "citer")
            up = 1 - score if kind == "citer" else score  # citer escalates low confidence
            out.append((label, PolicySpec(kind, {"head": str(path)}), taus, up))
    return out


def alone(path: Path, jobs: list[Job], args: argparse.Namespace) -> tuple[list[Any], float]:
    """One model serving the jobs by itself: (generations, seconds)."""
    group = start_group([path], PolicySpec("scripted", {"schedule": [0]}), args.cpu_linear)
    try:
        return run(group, jobs, args.concurrency)
    finally:
        group.close()


def main(argv: list[str] | None = None) -> int:
    evaluate(argv)
    return 0


def evaluate(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = Result("eval routing", None if argv is None else ["tokenrouterd", "eval",
                                                               "routing", *argv])  # fmt: skip
    torch.set_num_threads(1)  # the engine processes use the cores
    shares = [float(s) for s in args.shares.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    params = SamplingParams(max_tokens=args.max_tokens)
    jobs: list[Job] = [(p, params) for p in judging_prompts(args.prompts, args.small,
                                                     args.num_prompts)]  # fmt: skip
    large_only = alone(args.large, jobs, args)
    judge = Judge(args.large, jobs, [g.tokens for g in large_only[0]])
    points: list[dict[str, Any]] = []
    for label, (gens, seconds) in (("large-only", large_only),
                                   ("small-only", alone(args.small, jobs, args))):  # fmt: skip
        point = judge.point(label, None, gens, seconds)
        point.large_share = 1.0 if label == "large-only" else 0.0
        print(f"{label}: identical {point.identical:.2f} nll {point.nll:.3f} "
              f"{point.tok_s:.1f} tok/s", flush=True)  # fmt: skip
        points.append(vars(point))
    pos = data.teacher_force(args.small, [p for p, _ in jobs], judge.reference)
    pair = [args.small, args.large]
    offline = {}
    for label, spec, taus, score in curves(args, pos, shares, frozenset(args.curves.split(","))):
        offline[label] = recall_threshold(score, pos.mismatch.float())[2]
        points += sweep(pair, label, spec, taus, jobs, judge, args.concurrency, args.cpu_linear,
                        TABLE_SHARES)  # fmt: skip
    settings = {
        "small": str(args.small), "large": str(args.large), "prompts": len(jobs),
        "prompt_source": args.prompts, "max_tokens": args.max_tokens,
        "concurrency": args.concurrency, "cpu_linear": args.cpu_linear,
    }  # fmt: skip
    result.system("pair", settings)
    for row in points:
        result.run({"system": row["policy"], **row})
    result.body["offline_share_at_recall_95"] = offline
    result.write(args.out / "quality.json")
    title = f"{args.small.name} + {args.large.name}"
    plot(points, args.out, title)
    md = table(points, list(TABLE_SHARES)) + "\n\n" + offline_table(offline)
    (args.out / "quality_table.md").write_text(md + "\n")
    print(md)
    print(f"wrote {args.out}", flush=True)
    return result.body
