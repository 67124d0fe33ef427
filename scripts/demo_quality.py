"""How the demo pair answers: small alone, large alone and routed with R-Stitch, side by side.

Ten questions (chat and code), answered greedily by each; for every answer its share of
tokens made by the large model and its mean negative log-likelihood per token under
the large model (lower = closer to what the large model would say). Routing runs the
daemon's own parts in one process: two `RoutingEngine`s in the pair's served dtype
(bfloat16 for the Qwen pair) with the R-Stitch policy, handing requests to each other
through in-memory inboxes. Writes a Markdown report (table + answers), prints the table.

    .venv/bin/python scripts/demo_quality.py [--tau 0.5] [--out docs/demo.md]
    .venv/bin/python scripts/demo_quality.py --find-tau 0.25   # bisect tau for a share
    .venv/bin/python scripts/demo_quality.py --unsure          # the small model's entropies

--find-tau bisects the threshold that gives the large model the requested share of the
output tokens on a separate set of chat and code questions, and prints it. --unsure is
its one-pass estimate: the small model answers those questions alone (greedy, up to its
end of turn) and, per tau, the share of its positions whose normalised entropy is above
tau (R-Stitch hands those to the large model, which keeps the request while unsure).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from trd.demo.pair import DTYPE, RSTITCH_TAU, ensure_demo_pair
from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.frontend.tokens import PromptEncoder
from trd.policies.base import normalized_entropy
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.supervisor.generation import Generation
from trd.testing.wiring import Wiring

QUESTIONS = (
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Name three fruits that are red.",
    "Write a Python function that checks whether a string is a palindrome.",
    "What is the difference between a list and a tuple in Python?",
    "Write a SQL query that counts the orders per customer in a table orders.",
    "Why do we have seasons on Earth?",
    "Write a JavaScript function that removes duplicates from an array.",
    "Explain what a hash map is in two sentences.",
    "Write a Python function that merges two sorted lists.",
)
# For --find-tau: other questions, so that the threshold is not fitted to the table.
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
MAX_TOKENS = 96
KV_TOKENS = 16384
DTYPE_SERVED = DTYPE["qwen"]
STEP_TOKENS = 48  # decode steps timed per batch size


def chat_prompts(model_dir: Path, questions: Sequence[str]) -> list[list[int]]:
    """The questions as the daemon's /v1/chat/completions renders them."""
    encoder = PromptEncoder(model_dir)
    return [encoder.chat([{"role": "user", "content": q}]) for q in questions]


def alone(path: Path, prompts: list[list[int]]) -> list[list[int]]:
    engine = Engine(EngineSpec.of(path, dtype=DTYPE_SERVED, kv_tokens=KV_TOKENS))
    return engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))


def routed(paths: Sequence[Path], tau: float, prompts: list[list[int]]) -> list[Generation]:
    """R-Stitch over the two engines; each answer's tokens and the model of each."""
    pair = Wiring.of(paths, PolicySpec("rstitch", {"threshold": tau}), dtype=DTYPE_SERVED,
                kv_tokens=KV_TOKENS)  # fmt: skip
    return pair.run([(p, SamplingParams(max_tokens=MAX_TOKENS)) for p in prompts])


def large_share(answers: Sequence[Generation]) -> float:
    models = [m for t in answers for m in t.models]
    return sum(models) / max(1, len(models))


def find_tau(
    paths: Sequence[Path], share: float, iterations: int, between: Sequence[float]
) -> float:
    """Bisect tau (higher tau = fewer tokens from large) for the target large share."""
    prompts = chat_prompts(paths[1], TUNING_QUESTIONS)
    low, high = between
    for _ in range(iterations):
        tau = (low + high) / 2
        got = large_share(routed(paths, tau, prompts))
        print(f"tau {tau:.4f}: large share {got:.1%}", flush=True)
        low, high = (tau, high) if got > share else (low, tau)
    return (low + high) / 2


UNSURE_TAUS = (0.02, 0.05, 0.08, 0.1, 0.12, 0.15, 0.2)


def unsure(small: Path) -> None:
    """Print, per tau, the share of the small model's greedy positions with H > tau."""
    prompts = chat_prompts(small, TUNING_QUESTIONS)
    engine = Engine(EngineSpec.of(small, dtype=DTYPE_SERVED, kv_tokens=KV_TOKENS))
    params = SamplingParams(max_tokens=MAX_TOKENS)
    rows: list[torch.Tensor] = []
    for p in prompts:
        engine.add_request(p, params)
    while (step := engine.forward()) is not None:
        rows.append(normalized_entropy(step.forward.logits.float()))
        for req, token in zip(step.requests, step.tokens, strict=True):
            engine.commit(req, [token])
    h = torch.cat(rows)
    print(f"{len(h)} positions of {len(prompts)} answers, {DTYPE_SERVED}")
    for tau in UNSURE_TAUS:
        print(f"tau {tau:.2f}: the small model is unsure at {(h > tau).float().mean():.1%}")


@torch.inference_mode()
def mean_nll(model: torch.nn.Module, prompt: list[int], answer: list[int]) -> float:
    """Mean negative log-likelihood (nats) of answer's tokens after prompt."""
    ids = torch.tensor([prompt + answer])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), -1)
    return -logp.gather(-1, torch.tensor(answer)[:, None]).mean().item()


def step_ms(path: Path, batch: int) -> float:
    """Median decode step of our engine (served dtype) at a batch size, ms."""
    engine = Engine(EngineSpec.of(path, dtype=DTYPE_SERVED, kv_tokens=KV_TOKENS))
    params = SamplingParams(max_tokens=STEP_TOKENS, ignore_eos=True)
    for i in range(batch):
        engine.add_request([1 + (7 * i + j) % 1000 for j in range(32)], params)
    engine.step()  # the prompts
    times = []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def decoded(tok: PreTrainedTokenizerBase, tokens: list[int]) -> str:
    text = tok.decode(tokens, skip_special_tokens=True)
    assert isinstance(text, str)  # one sequence of ids decodes to one string
    return text


def marked(tok: PreTrainedTokenizerBase, tokens: list[int], models: list[int]) -> str:
    """The answer's text with the large model's runs of tokens inside «...»."""
    out, i = [], 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and models[j] == models[i]:
            j += 1
        text = decoded(tok, tokens[i:j])
        out.append(f"«{text}»" if models[i] == 1 else text)
        i = j
    return "".join(out)


def report(args: argparse.Namespace, paths: dict[str, Path], tau: float) -> str:
    prompts = chat_prompts(paths["large"], QUESTIONS)
    answers = {name: alone(paths[name], prompts) for name in ("small", "large")}
    traces = routed([paths["small"], paths["large"]], tau, prompts)
    answers["routed"] = [t.tokens for t in traces]
    large = AutoModelForCausalLM.from_pretrained(paths["large"], dtype=torch.bfloat16).eval()
    nll = {
        name: [mean_nll(large, p, a) for p, a in zip(prompts, outs, strict=True)]
        for name, outs in answers.items()
    }
    steps = {name: {b: step_ms(paths[name], b) for b in (1, 16)} for name in ("small", "large")}
    tok = AutoTokenizer.from_pretrained(paths["large"])
    lines = [
        "# The demo pair: small alone, large alone, routed (R-Stitch)",
        "",
        f"Written by `{' '.join(sys.argv)}`. Small: Qwen2.5-Coder-0.5B-Instruct, large:"
        f" Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUFs imported in {DTYPE_SERVED}). Greedy, at"
        f" most {MAX_TOKENS} tokens, {DTYPE_SERVED}, R-Stitch threshold tau = {tau:.3f}. NLL ="
        " mean negative log-likelihood per answer token under the large model (nats, in"
        " bfloat16; the large model's own answers are the floor). Large share = the routed"
        " answer's tokens made by the large model.",
        "",
        f"Decode step of our engine ({DTYPE_SERVED}, {args.threads} thread(s)), ms: small"
        f" {steps['small'][1]:.1f} at batch 1, {steps['small'][16]:.1f} at batch 16; large"
        f" {steps['large'][1]:.1f} at batch 1, {steps['large'][16]:.1f} at batch 16.",
        "",
        "| # | question | small NLL | large NLL | routed NLL | routed large share | tokens s/l/r |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, q in enumerate(QUESTIONS):
        share = sum(traces[i].models) / max(1, len(traces[i].models))
        counts = "/".join(str(len(answers[n][i])) for n in ("small", "large", "routed"))
        lines.append(
            f"| {i + 1} | {q} | {nll['small'][i]:.2f} | {nll['large'][i]:.2f} |"
            f" {nll['routed'][i]:.2f} | {share:.0%} | {counts} |"
        )
    means = {n: float(np.mean(v)) for n, v in nll.items()}
    lines += [
        f"| | **mean** | {means['small']:.2f} | {means['large']:.2f} | {means['routed']:.2f} |"
        f" {large_share(traces):.0%} | |",
        "",
        "## Answers",
        "",
        "In the routed answers, «...» marks the tokens the large model made.",
    ]
    for i, q in enumerate(QUESTIONS):
        lines += ["", f"### {i + 1}. {q}"]
        texts = {n: decoded(tok, answers[n][i]) for n in ("small", "large")}
        texts["routed"] = marked(tok, traces[i].tokens, traces[i].models)
        for name, text in texts.items():
            lines += ["", f"**{name}** (NLL {nll[name][i]:.2f})", "", "````text", text, "````"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--small", type=Path, help="small model folder (default: the demo pair's)")
    ap.add_argument("--large", type=Path, help="large model folder (default: the demo pair's)")
    ap.add_argument("--tau", type=float, default=RSTITCH_TAU["qwen"], help="R-Stitch threshold")
    ap.add_argument("--find-tau", type=float, metavar="SHARE", help="bisect tau for this share")
    ap.add_argument("--unsure", action="store_true", help="the small model's entropies, per tau")
    ap.add_argument("--iterations", type=int, default=7, help="--find-tau: bisection steps")
    ap.add_argument("--between", type=float, nargs=2, default=(0.0, 1.0), metavar=("LOW", "HIGH"),
                    help="--find-tau: the range to bisect (default: 0 1)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    ap.add_argument("--out", type=Path, default=Path("docs/demo.md"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    paths = ensure_demo_pair().models if args.small is None or args.large is None else {}
    paths = {"small": args.small or paths["small"], "large": args.large or paths["large"]}
    if args.unsure:
        unsure(paths["small"])
        return
    if args.find_tau is not None:
        tau = find_tau(
            [paths["small"], paths["large"]], args.find_tau, args.iterations, args.between
        )
        print(f"tau for a {args.find_tau:.0%} large share: {tau:.4f}")
        return
    text = report(args, paths, args.tau)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text.split("## Answers")[0])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
