"""`tokenrouterd eval demo`: how the demo pair answers: small alone, large alone and routed
with R-Stitch, side by side.

    tokenrouterd eval demo --out demo.json [--markdown docs/demo.md] [--tau 0.1]

Ten questions (chat and code), answered greedily by each, in this process as the daemon
runs them (`inprocess.py`: our engines in the pair's served dtype, the routed ones
handing requests to each other). For every answer: the share of its tokens the large
model made and its mean negative log-likelihood per token under the large model
(transformers, bfloat16; lower = closer to what the large model would say); and each
model's decode step of our engine at batch 1 and 16. Writes the one result schema (a run
per system, a record per question with its text) and, with --markdown, the report
docs/demo.md is (the table, the step costs, the answers with the large model's tokens
marked «...»), made from that result.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from trd.bench.result import Result
from trd.demo.pair import DTYPE, RSTITCH_TAU, ensure_demo_pair
from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.evals.inprocess import KV_TOKENS, alone, large_share, response_nll, routed
from trd.frontend.tokens import PromptEncoder
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.routers.prompts import chat_prompts

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
MAX_TOKENS = 96
SERVED = DTYPE["qwen"]
STEP_TOKENS = 48  # decode steps timed per batch size
SYSTEMS = ("small", "large", "routed")


def step_ms(path: Path, batch: int) -> float:
    """Median decode step of our engine (served dtype) at a batch size, ms."""
    engine = Engine(EngineSpec.of(path, dtype=SERVED, kv_tokens=KV_TOKENS))
    params = SamplingParams(max_tokens=STEP_TOKENS, ignore_eos=True)
    for i in range(batch):
        engine.add_request([1 + (7 * i + j) % 1000 for j in range(32)], params)
    engine.step()  # the prompts
    times = []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def marked(encoder: PromptEncoder, tokens: list[int], models: list[int]) -> str:
    """The answer's text with the large model's runs of tokens inside «...»."""
    out, i = [], 0
    while i < len(tokens):
        j = i
        while j < len(tokens) and models[j] == models[i]:
            j += 1
        text = encoder.decode(tokens[i:j])
        out.append(f"«{text}»" if models[i] else text)
        i = j
    return "".join(out)


def evaluate(paths: dict[str, Path], tau: float, result: Result) -> None:
    prompts = chat_prompts(paths["large"], QUESTIONS, len(QUESTIONS))
    answers = {name: alone(paths[name], prompts, MAX_TOKENS, SERVED) for name in ("small", "large")}
    spec = PolicySpec("rstitch", {"threshold": tau})
    traces = routed([paths["small"], paths["large"]], spec, prompts, MAX_TOKENS, SERVED)
    answers["routed"] = [t.tokens for t in traces]
    large = AutoModelForCausalLM.from_pretrained(paths["large"], dtype=torch.bfloat16).eval()
    encoder = PromptEncoder(paths["large"])
    for name in SYSTEMS:
        records: list[dict[str, Any]] = []
        for i, (prompt, tokens) in enumerate(zip(prompts, answers[name], strict=True)):
            share = float(name == "large") if name != "routed" else large_share([traces[i]])
            text = marked(encoder, tokens, traces[i].models) if name == "routed" else (
                encoder.decode(tokens))  # fmt: skip
            records.append({"question": QUESTIONS[i], "tokens": len(tokens), "large_share": share,
                            "nll": response_nll(large, prompt, tokens) / max(1, len(tokens)),
                            "text": text})  # fmt: skip
        share = large_share(traces) if name == "routed" else float(name == "large")
        steps = {} if name == "routed" else {f"step_ms_batch{b}": step_ms(paths[name], b)
                                             for b in (1, 16)}  # fmt: skip
        result.run({"system": name, "summary": {
            "nll_mean": statistics.mean(r["nll"] for r in records), "large_share": share,
            **steps}, "records": records})  # fmt: skip


def markdown(body: dict[str, Any]) -> str:
    """docs/demo.md, from the result."""
    runs = {run["system"]: run for run in body["runs"]}
    cfg, steps = body["systems"]["routed"], {n: runs[n]["summary"] for n in ("small", "large")}
    lines = [
        "# The demo pair: small alone, large alone, routed (R-Stitch)",
        "",
        f"Written by `{' '.join(body['command'])}` (commit {(body['git'] or {}).get('commit')}, "
        f"load average {body['machine']['start']['load'][0]} at the start). Small: "
        "Qwen2.5-Coder-0.5B-Instruct, large: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUFs "
        f"imported in {SERVED}). Greedy, at most {MAX_TOKENS} tokens, R-Stitch threshold "
        f"tau = {cfg['threshold']:.3f}. NLL = mean negative log-likelihood per answer token "
        "under the large model (nats, in bfloat16; the large model's own answers are the "
        "floor). Large share = the routed answer's tokens made by the large model.",
        "",
        f"Decode step of our engine ({SERVED}, {cfg['threads']} thread(s)), ms: small "
        f"{steps['small']['step_ms_batch1']:.1f} at batch 1, "
        f"{steps['small']['step_ms_batch16']:.1f} at batch 16; large "
        f"{steps['large']['step_ms_batch1']:.1f} at batch 1, "
        f"{steps['large']['step_ms_batch16']:.1f} at batch 16.",
        "",
        "| # | question | small NLL | large NLL | routed NLL | routed large share | tokens s/l/r |",
        "|---|---|---|---|---|---|---|",
    ]
    recs = {n: runs[n]["records"] for n in SYSTEMS}
    for i, q in enumerate(QUESTIONS):
        counts = "/".join(str(recs[n][i]["tokens"]) for n in SYSTEMS)
        lines.append(f"| {i + 1} | {q} | " + " | ".join(f"{recs[n][i]['nll']:.2f}" for n in SYSTEMS)
                     + f" | {recs['routed'][i]['large_share']:.0%} | {counts} |")  # fmt: skip
    means = " | ".join(f"{runs[n]['summary']['nll_mean']:.2f}" for n in SYSTEMS)
    lines += [f"| | **mean** | {means} | {runs['routed']['summary']['large_share']:.0%} | |",
              "", "## Answers", "", "In the routed answers, «...» marks the tokens the large "
              "model made."]  # fmt: skip
    for i, q in enumerate(QUESTIONS):
        lines += ["", f"### {i + 1}. {q}"]
        for n in SYSTEMS:
            lines += ["", f"**{n}** (NLL {recs[n][i]['nll']:.2f})", "", "````text",
                      recs[n][i]["text"], "````"]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tokenrouterd eval demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--small", type=Path, help="small model folder (default: the demo pair's)")
    p.add_argument("--large", type=Path, help="large model folder (default: the demo pair's)")
    p.add_argument("--tau", type=float, default=RSTITCH_TAU["qwen"], help="R-Stitch threshold")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.add_argument("--out", type=Path, required=True, help="the result JSON")
    p.add_argument("--markdown", type=Path, help="also write the report (docs/demo.md)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    pair = ensure_demo_pair().models if args.small is None or args.large is None else {}
    paths = {"small": args.small or pair["small"], "large": args.large or pair["large"]}
    result = Result("eval demo", None if argv is None else ["tokenrouterd", "eval", "demo", *argv])
    for name in ("small", "large"):
        result.system(name, {"path": str(paths[name]), "dtype": SERVED, "threads": args.threads})
    result.system("routed", {"policy": "rstitch", "threshold": args.tau, "dtype": SERVED,
                             "threads": args.threads})  # fmt: skip
    evaluate(paths, args.tau, result)
    print(f"wrote {result.write(args.out)}")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(result.body))
        print(f"wrote {args.markdown}")
    return 0
