"""How the demo pair answers: small alone, large alone and routed with R-Stitch, side by side.

Ten simple chat questions, answered greedily by each; for every answer its share of
tokens made by the large model and its mean negative log-likelihood per token under
the large model (lower = closer to what the large model would say). Routing runs the
daemon's own parts in one process: two `RoutingEngine`s (float32) with the R-Stitch
policy, handing requests to each other through in-memory inboxes. Writes a Markdown
report (table + answers) and prints the table.

    .venv/bin/python scripts/demo_quality.py [--tau 0.5] [--out docs/demo.md]
    .venv/bin/python scripts/demo_quality.py --find-tau 0.25   # bisect tau for a share

--find-tau bisects the threshold that gives the large model the requested share of the
output tokens on a separate set of chat questions, and prints it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)

from trd.demo import distil, teacher
from trd.demo.pair import RSTITCH_TAU, ensure_demo_pair
from trd.demo.partner import LAYERS, slice_of
from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.frontend.tokens import PromptEncoder
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.supervisor.generation import Generation
from trd.testing.wiring import Wiring

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "What is 2 + 2?",
    "Write a Python function that returns the factorial of n.",
    "Name three fruits that are red.",
    "Why do we have seasons on Earth?",
    "Give me a tip for staying focused while studying.",
    "What is the opposite of 'cold'?",
    "How many legs does a spider have?",
    "Tell me a short joke.",
)
# Held-out conversations: seeds far from the build's (seed * 1_000_003 + i, i < 320).
HELDOUT_CHATS = 32
HELDOUT_SEEDS = [7_777_777 + i for i in range(HELDOUT_CHATS)]
# For --find-tau: other questions, so that the threshold is not fitted to the table.
TUNING_QUESTIONS = (
    "What is the boiling point of water at sea level?",
    "Write a short poem about the ocean.",
    "How do I reverse a list in Python?",
    "What are three tips for better sleep?",
    "Explain what photosynthesis is in simple terms.",
    "Who wrote Romeo and Juliet?",
    "What is 15 multiplied by 4?",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
    "Write a limerick about a cat.",
    "What does a CPU do?",
    "Suggest a name for a pet turtle.",
    "What is the largest planet in our solar system?",
    "How do I make a cup of tea?",
    "Give me three synonyms for happy.",
    "Explain recursion to a child.",
)
MAX_TOKENS = 96
KV_TOKENS = 16384
STEP_TOKENS = 48  # decode steps timed per batch size


def chat_prompts(model_dir: Path, questions: Sequence[str]) -> list[list[int]]:
    """The questions as the daemon's /v1/chat/completions renders them."""
    encoder = PromptEncoder(model_dir)
    return [encoder.chat([{"role": "user", "content": q}]) for q in questions]


def alone(path: Path, prompts: list[list[int]]) -> list[list[int]]:
    engine = Engine(EngineSpec.of(path, dtype="float32", kv_tokens=KV_TOKENS))
    return engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))


def routed(paths: Sequence[Path], tau: float, prompts: list[list[int]]) -> list[Generation]:
    """R-Stitch over the two engines; each answer's tokens and the model of each."""
    pair = Wiring.of(paths, PolicySpec("rstitch", {"threshold": tau}), dtype="float32",
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


@torch.inference_mode()
def mean_nll(model: torch.nn.Module, prompt: list[int], answer: list[int]) -> float:
    """Mean negative log-likelihood (nats) of answer's tokens after prompt."""
    ids = torch.tensor([prompt + answer])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), -1)
    return -logp.gather(-1, torch.tensor(answer)[:, None]).mean().item()


@torch.inference_mode()
def heldout(paths: dict[str, Path]) -> dict[str, dict[str, float]]:
    """The partner (and the untrained slice it started from) on HELDOUT_CHATS conversations
    the large model wrote from seeds the build never used: per answer position, KL to the
    large model's top-k distribution, cross-entropy of the large model's greedy token and
    top-1 agreement with it (teacher-forced)."""
    chats = teacher.converse(paths["large"], HELDOUT_SEEDS, 64, 128, progress=False)
    batch = distil.collate(chats, pad_id=0)
    target = batch.top_ids[:, 0]
    partner = AutoModelForCausalLM.from_pretrained(paths["small"], dtype=torch.float32)
    assert isinstance(partner, LlamaForCausalLM)  # a saved slice of the large (trd.demo.partner)
    models = {"partner": partner, "untrained slice": slice_of(paths["large"], LAYERS)}
    out = {}
    for name, model in models.items():
        logits = distil.student_logits(model.eval(), batch, distil.output_weight(model))
        out[name] = {
            "kl": distil.kl_loss(logits, batch.top_ids, batch.top_logp).item(),
            "ce": torch.nn.functional.cross_entropy(logits, target).item(),
            "top1": (logits.argmax(-1) == target).float().mean().item(),
            "positions": float(len(target)),
        }
    return out


def step_ms(path: Path, batch: int) -> float:
    """Median decode step of our engine (float32) at a batch size, ms."""
    engine = Engine(EngineSpec.of(path, dtype="float32", kv_tokens=KV_TOKENS))
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
    large = AutoModelForCausalLM.from_pretrained(paths["large"], dtype=torch.float32).eval()
    nll = {
        name: [mean_nll(large, p, a) for p, a in zip(prompts, outs, strict=True)]
        for name, outs in answers.items()
    }
    steps = {name: {b: step_ms(paths[name], b) for b in (1, 16)} for name in ("small", "large")}
    held = heldout(paths)
    tok = AutoTokenizer.from_pretrained(paths["large"])
    lines = [
        "# The demo pair: small alone, large alone, routed (R-Stitch)",
        "",
        f"Written by `scripts/demo_quality.py`. Large: SmolLM2-135M-Instruct; small: its partner"
        f" (`trd.demo.partner`). Greedy, at most {MAX_TOKENS} tokens, float32, R-Stitch"
        f" threshold tau = {tau:.3f}. NLL = mean negative log-likelihood per answer token under"
        " the large model (nats; the large model's own answers are the floor). Large share ="
        " the routed answer's tokens made by the large model.",
        "",
        f"Decode step of our engine (float32, {args.threads} thread(s)), ms: small"
        f" {steps['small'][1]:.1f} at batch 1, {steps['small'][16]:.1f} at batch 16; large"
        f" {steps['large'][1]:.1f} at batch 1, {steps['large'][16]:.1f} at batch 16.",
        "",
        f"The partner on {HELDOUT_CHATS} held-out conversations the large model wrote (seeds the"
        f" build never used; {held['partner']['positions']:.0f} answer positions, teacher-forced):",
        "",
        "| model | KL to large's top-64 (nats) | cross-entropy, large's token | top-1 agreement |",
        "|---|---|---|---|",
        *(
            f"| {name} | {h['kl']:.3f} | {h['ce']:.3f} | {h['top1']:.1%} |"
            for name, h in held.items()
        ),
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
    ap.add_argument("--tau", type=float, default=RSTITCH_TAU["smollm2"], help="R-Stitch threshold")
    ap.add_argument("--find-tau", type=float, metavar="SHARE", help="bisect tau for this share")
    ap.add_argument("--iterations", type=int, default=7, help="--find-tau: bisection steps")
    ap.add_argument("--between", type=float, nargs=2, default=(0.0, 1.0), metavar=("LOW", "HIGH"),
                    help="--find-tau: the range to bisect (default: 0 1)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    ap.add_argument("--out", type=Path, default=Path("docs/demo.md"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    paths = ensure_demo_pair().models if args.small is None or args.large is None else {}
    paths = {"small": args.small or paths["small"], "large": args.large or paths["large"]}
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
