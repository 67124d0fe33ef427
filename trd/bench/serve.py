"""`tokenrouterd bench serve`: measure any OpenAI-compatible server at a URL.

    tokenrouterd bench serve --base-url http://127.0.0.1:8000 --dataset code \\
        --num-prompts 16 --max-tokens 256 --max-concurrency 16 --out result.json

Sends a dataset's prompts (`datasets.py`) through the load client (`client.py`), prints
a table (throughput; TTFT, TPOT, ITL, end-to-end latency: mean, p50, p90, p99; the
large-token share, handoffs and identity digest where the server returns token ids and
producers, "-" where it does not) and writes the result JSON (`result.py`) with every
request's record. Greedy (temperature 0) unless told otherwise. With `--duration`, the
long-load mode instead (`soak.py`): mixed request shapes for that long, each process's
memory sampled through the daemon's admin API, its growth after a warm-up judged.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

from trd.bench import datasets, soak
from trd.bench.client import ENDPOINTS, Client, Settings, add_extra_body_arg, served_model
from trd.bench.load import run_load
from trd.bench.metrics import summarize
from trd.bench.result import Result


def add_load_args(p: argparse.ArgumentParser) -> None:
    """The dataset and load options `bench serve` shares with the commands built on it."""
    p.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="chat")
    p.add_argument("--dataset", default="chat", metavar="NAME",
                   help=f"one of {', '.join(datasets.NAMES)} (default: chat)")  # fmt: skip
    p.add_argument("--num-prompts", type=int, default=16,
                   help="conversations to send (default: 16)")  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=256, help="per request (default: 256)")
    p.add_argument(
        "--max-concurrency",
        type=int,
        metavar="N",
        help="closed loop: N conversations in flight (with --request-rate: a cap)",
    )
    p.add_argument("--request-rate", type=float, default=math.inf, metavar="R",
                   help="open loop: Poisson arrivals of R conversations/s (default: inf, "
                   "all at once unless --max-concurrency)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="prompt order and arrivals (default: 0)")
    p.add_argument("--input-len", type=int, default=100, help="random: words a prompt")
    p.add_argument("--agent-turns", type=int, default=datasets.AgentShape().turns,
                   help="agent: turns a conversation")  # fmt: skip
    p.add_argument("--temperature", type=float, default=0.0, help="default 0: greedy")
    p.add_argument("--ignore-eos", action="store_true",
                   help="every request makes exactly --max-tokens tokens")  # fmt: skip
    p.add_argument(
        "--no-token-ids",
        action="store_true",
        help="do not ask for return_token_ids (a server that rejects the field)",
    )
    add_extra_body_arg(p)


def check_load_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for key in ("num_prompts", "max_tokens", "input_len", "agent_turns"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')}: must be at least 1, got {getattr(args, key)}")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        p.error(f"--max-concurrency: must be at least 1, got {args.max_concurrency}")
    if not args.request_rate > 0:
        p.error(f"--request-rate: must be above 0, got {args.request_rate}")


def load_dataset(args: argparse.Namespace, tokenizer: Path | None = None) -> list[Any]:
    shape = datasets.AgentShape(turns=args.agent_turns)
    return datasets.load(args.dataset, args.num_prompts, args.seed, endpoint=args.endpoint,
                         input_len=args.input_len, agent=shape, tokenizer=tokenizer)  # fmt: skip


async def measure(
    url: str, args: argparse.Namespace, convs: list[Any], label: str = "",
    api_key: str | None = None, timeout_s: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One run of `convs` against the server at `url`: settings, summary, records."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        model = args.model or await served_model(session, url, api_key)
        settings = Settings(url, model, args.endpoint, args.max_tokens, args.temperature,
                            args.ignore_eos, not args.no_token_ids, api_key,
                            args.extra_body)  # fmt: skip
        records, wall = await run_load(
            Client(session, settings), convs, max_concurrency=args.max_concurrency,
            request_rate=args.request_rate, seed=args.seed, label=label or url,
        )  # fmt: skip
    load = {"dataset": args.dataset, "num_prompts": args.num_prompts,
            "max_concurrency": args.max_concurrency, "request_rate": args.request_rate,
            "seed": args.seed}  # fmt: skip
    return {
        "system": label or url,
        "settings": {**asdict(settings), "api_key": None, **load},
        "summary": summarize(records, wall),
        "records": [r.to_dict() for r in records],
    }


def _cell(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def table(run: dict[str, Any]) -> list[str]:
    """The run as vLLM's `bench serve` prints it, plus the token-model lines."""
    s, cfg = run["summary"], run["settings"]
    rate = "inf" if math.isinf(cfg["request_rate"]) else f"{cfg['request_rate']:g}/s"
    lines = [
        f"==== bench serve: {cfg['base_url']} ({cfg['model']}, {cfg['endpoint']}) ====",
        f"dataset {cfg['dataset']}, {s['requests']} requests, max_tokens {cfg['max_tokens']}, "
        f"max concurrency {cfg['max_concurrency'] or '-'}, request rate {rate}",
        f"{'Successful requests:':34}{s['requests'] - s['failed']}",
        f"{'Failed requests:':34}{s['failed']}",
        f"{'Duration (s):':34}{s['duration_s']:.2f}",
        f"{'Prompt tokens:':34}{s['prompt_tokens'] if s['prompt_tokens'] is not None else '-'}",
        f"{'Output tokens:':34}{s['output_tokens']}",
        f"{'Request throughput (req/s):':34}{_cell(s['request_throughput'], '.2f')}",
        f"{'Output throughput (tok/s):':34}{_cell(s['output_throughput'], '.2f')}",
        f"{'':12}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    for key, name in (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("itl_ms", "ITL (ms)"),
                      ("e2el_ms", "E2EL (ms)")):  # fmt: skip
        lines.append(f"{name:12}" + "".join(f"{_cell(s[key][k]):>10}"
                                            for k in ("mean", "p50", "p90", "p99")))  # fmt: skip
    share = s["large_share"]
    large = "-" if share is None else f"{100 * share:.1f}% ({s['large_model']})"
    lines += [
        f"{'Large-token share:':34}{large}",
        f"{'Handoffs per request:':34}{_cell(s['handoffs_per_request'], '.2f')}",
        f"{'Identity digest:':34}{s['identity'] or '-'}",
    ]
    if s["first_error"]:
        lines.append(f"{'First error:':34}{s['first_error']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="tokenrouterd bench serve", description=__doc__.split("\n\n")[0],
        epilog="Columns, datasets and load: see trd/bench/serve.py, datasets.py, client.py.",
    )  # fmt: skip
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="the model to ask for (default: the first of /v1/models)")
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY' "
                   "(default: $OPENAI_API_KEY, if set)")  # fmt: skip
    p.add_argument("--timeout", type=float, help="seconds a request may take (default: none)")
    p.add_argument("--label", default="", help="the system's name in the result")
    p.add_argument("--out", type=Path, help="write the result JSON here")
    add_load_args(p)
    soak.add_args(p)
    args = p.parse_args(argv)
    check_load_args(p, args)
    command = None if argv is None else ["tokenrouterd", "bench", "serve", *argv]
    api_key = args.api_key or os.environ.get("OPENAI_API_KEY")
    if args.duration is not None:
        return soak.main(args, command, api_key)
    try:
        convs = load_dataset(args)
    except ValueError as exc:
        p.error(str(exc))
    result = Result("bench serve", command)
    try:
        run = asyncio.run(measure(args.base_url, args, convs, args.label, api_key, args.timeout))
    except (aiohttp.ClientError, RuntimeError, OSError) as exc:
        print(f"tokenrouterd bench serve: {args.base_url}: {exc}", file=sys.stderr)
        return 1
    result.system(run["system"], {"base_url": args.base_url, "model": run["settings"]["model"]})
    result.run(run)
    print("\n".join(table(run)))
    if args.out:
        print(f"wrote {result.write(args.out)}")
    return 0 if run["summary"]["failed"] == 0 else 1
