"""`tokenrouterd eval structured`: structured outputs on any OpenAI-compatible server:
validity, large-token share, throughput with and without constraints, mask time.

    tokenrouterd eval structured --base-url http://127.0.0.1:8000 --out structured.json \\
        [--passes constrained,unconstrained] [--max-concurrency 16] [--every 5] [--max-tokens]

Sends the 50 tasks of `tasks.py` through the project's load client (streamed chat,
greedy), one pass after another on the same server:

    constrained    each task's constraint (response_format, structured_outputs.regex,
                   guided_choice, tools with tool_choice); every answer is checked
                   (jsonschema, the regex, the choices, the tools' schemas), tool calls
                   read from the streamed deltas
    unconstrained  the same chat prompts (tools offered, tool_choice none), each made to
                   write as many tokens as its answer in the last constrained pass
                   (ignore_eos), so the two throughputs compare the same work

A pass may be named twice: the first constrained pass also fills the server's prefix
cache with the prompts, so the passes after it are the ones to compare. Each pass is a
run of the result (the one schema, trd/bench/result.py) with the load client's summary
(tokens/s; the large-token share where the server returns producers), the valid count
per kind, and, where the server exports our engines' counters on /metrics
(trd_engine_steps, trd_engine_busy_seconds, trd_engine_grammar_mask_seconds), the mean
step and the grammar masks' time per step; other servers leave those None.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import aiohttp

from trd.bench.client import Client, Settings, base_url
from trd.bench.datasets import Conversation
from trd.bench.load import run_load
from trd.bench.metrics import summarize
from trd.bench.record import Record
from trd.bench.result import Result
from trd.evals import server
from trd.evals.server import add_server_args, check_server_args, percent
from trd.evals.structured.tasks import KINDS, Task, tasks

MAX_TOKENS = 200
PASSES = ("constrained", "unconstrained")
COUNTERS = ("steps", "busy_seconds", "grammar_mask_seconds")
SETTLE_S, SETTLE_READS = 0.6, 20


def counters(url: str) -> dict[str, float] | None:
    """Summed over the engines: steps, busy and mask seconds (None: not our daemon)."""
    try:
        text = urllib.request.urlopen(f"{base_url(url)}/metrics", timeout=30).read().decode()
    except (urllib.error.URLError, OSError):
        return None
    out = dict.fromkeys(COUNTERS, 0.0)
    for name in COUNTERS:
        found = re.findall(rf"^trd_engine_{name}_total\{{[^}}]*\}} (\S+)$", text, re.M)
        if not found:
            return None
        out[name] = sum(map(float, found))
    return out


def settled(url: str) -> dict[str, float] | None:
    """The counters once the engines' last reports are in: an engine reports every 0.5 s,
    so right after a pass the last steps may be missing (read then, a pass's last masks
    were counted in the next pass). Read until two reads SETTLE_S apart agree."""
    last = counters(url)
    for _ in range(SETTLE_READS):
        if last is None:
            return None
        time.sleep(SETTLE_S)
        now = counters(url)
        if now == last:
            return now
        last = now
    return last


class StructuredClient(Client):
    """The load client, asking the tasks with (or, given `lengths`, without) their
    constraints, and keeping each answer's tool calls from the streamed deltas."""

    def __init__(self, session: aiohttp.ClientSession, settings: Settings, work: Sequence[Task],
                 lengths: Sequence[int] | None) -> None:  # fmt: skip
        super().__init__(session, settings)
        self.work, self.lengths = work, lengths
        self.calls: dict[int, dict[int, dict[str, str]]] = {}  # conversation -> index -> call

    def body(self, conv: Conversation, turn: int, answers: Sequence[Record]) -> dict[str, Any]:
        body = super().body(conv, turn, answers)
        index = int(str(conv.turns[0]))
        task = self.work[index]
        body["messages"] = [{"role": "user", "content": task.prompt}]
        extra = dict(task.extra)
        if self.lengths is not None:  # the same prompt (tools included), no constraint
            extra = {"tools": extra["tools"], "tool_choice": "none"} if "tools" in extra else {}
            body |= {"max_tokens": self.lengths[index], "ignore_eos": True}
        return body | extra

    def _take(self, chunk: dict[str, Any], rec: Record) -> bool:  # type: ignore[override]
        got = Client._take(chunk, rec)
        for choice in chunk.get("choices") or []:
            for delta in (choice.get("delta") or {}).get("tool_calls") or []:
                call = self.calls.setdefault(rec.conversation, {}).setdefault(
                    int(delta.get("index", 0)), {"name": "", "arguments": ""}
                )
                fn = delta.get("function") or {}
                call["name"] += fn.get("name") or ""
                call["arguments"] += fn.get("arguments") or ""
                got = True
        return got


async def one_pass(
    args: argparse.Namespace, settings: Settings, work: Sequence[Task],
    lengths: Sequence[int] | None,
) -> tuple[list[Record], float, list[list[dict[str, str]]]]:  # fmt: skip
    async with server.session(args) as s:
        client = StructuredClient(s, settings, work, lengths)
        convs = [Conversation((str(i),)) for i in range(len(work))]
        recs, wall = await run_load(client, convs, max_concurrency=args.max_concurrency)
    calls = [list(client.calls.get(i, {}).values()) for i in range(len(work))]
    return recs, wall, calls


def measure(args: argparse.Namespace, result: Result) -> bool:
    """Every pass, each a run of `result`; whether every request succeeded."""
    work = tasks()[:: args.every]
    settings = asyncio.run(server.settings(args))
    lengths: list[int] | None = None
    ok = True
    for name in args.passes.split(","):
        constrained = name == "constrained"
        if not constrained and lengths is None:
            raise ValueError("--passes: an unconstrained pass follows a constrained one")
        before = settled(args.base_url)
        recs, wall, calls = asyncio.run(one_pass(args, settings, work,
                                                 None if constrained else lengths))  # fmt: skip
        after = settled(args.base_url)
        valid = [t.valid(r.text or None, c) if constrained and r.ok else None
                 for t, r, c in zip(work, recs, calls, strict=True)]  # fmt: skip
        summary = summarize(recs, wall) | mask_times(before, after)
        if constrained:
            lengths = [max(1, r.output_tokens) for r in recs]
            summary |= valid_counts(work, valid)
        rows = [{"task": t.kind, "valid": v, "tool_calls": c, **r.to_dict()}
                for t, v, c, r in zip(work, valid, calls, recs, strict=True)]  # fmt: skip
        result.run({"system": args.label, "pass": name, "settings": {**asdict(settings),
                    "api_key": None, "max_concurrency": args.max_concurrency,
                    "every": args.every}, "summary": summary, "records": rows})  # fmt: skip
        ok = ok and summary["failed"] == 0
        print(row(args.label, name, args.max_concurrency, summary, len(work)), flush=True)
    return ok


def valid_counts(work: Sequence[Task], valid: Sequence[bool | None]) -> dict[str, Any]:
    """The valid answers of each kind ("9/10") and in all."""
    kinds = {k: [v for t, v in zip(work, valid, strict=True) if t.kind == k] for k in KINDS}
    return {"valid": {k: f"{sum(v is True for v in vs)}/{len(vs)}" for k, vs in kinds.items()},
            "valid_total": sum(v is True for v in valid)}  # fmt: skip


def mask_times(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any]:
    if before is None or after is None or after["steps"] == before["steps"]:
        return {"step_ms": None, "mask_ms_per_step": None}
    steps = after["steps"] - before["steps"]
    return {"step_ms": 1e3 * (after["busy_seconds"] - before["busy_seconds"]) / steps,
            "mask_ms_per_step": 1e3 * (after["grammar_mask_seconds"]
                                       - before["grammar_mask_seconds"]) / steps}  # fmt: skip


HEADER = ("| system | pass | N | valid | large tokens | tokens | tok/s | step ms | mask ms/step |\n"
          "|---|---|---|---|---|---|---|---|---|")  # fmt: skip


def row(label: str, name: str, n: int, s: dict[str, Any], count: int) -> str:
    def cell(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    valid = "-"
    if "valid" in s:
        kinds = " ".join(f"{k} {v}" for k, v in s["valid"].items())
        valid = f"{s['valid_total']}/{count} ({kinds})"
    return (f"| {label} | {name} | {n} | {valid} | {percent(s['large_share'])} "
            f"| {s['output_tokens']} | {cell(s['output_throughput'], '.2f')} "
            f"| {cell(s['step_ms'], '.0f')} "
            f"| {cell(s['mask_ms_per_step'], '.2f')} |")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tokenrouterd eval structured",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    add_server_args(p, 16, MAX_TOKENS)
    p.add_argument(
        "--passes",
        default=",".join(PASSES),
        help=f"passes in order, of {', '.join(PASSES)} (default: %(default)s)",
    )
    p.add_argument(
        "--every",
        type=int,
        default=1,
        help="every k-th task only (5: 10 tasks, 4 JSON and 2 of each other kind)",
    )
    args = p.parse_args(argv)
    check_server_args(p, args, "every")
    unknown = set(args.passes.split(",")) - set(PASSES)
    if unknown:
        p.error(f"--passes: unknown {', '.join(sorted(unknown))}")
    command = None if argv is None else ["tokenrouterd", "eval", "structured", *argv]
    result = Result("eval structured", command)
    result.system(args.label, {"base_url": args.base_url, "model": args.model})
    print(HEADER)
    try:
        ok = measure(args, result)
    except (aiohttp.ClientError, RuntimeError, OSError, ValueError) as exc:
        print(f"tokenrouterd eval structured: {args.base_url}: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {result.write(args.out)}")
    return 0 if ok else 1
