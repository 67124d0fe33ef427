"""What the evaluations of a server at a URL share: its options (the server, the model,
the key, the result file, the load, the request timeout, token ids) and the HTTP session
the load client runs in."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import aiohttp

from trd.bench.client import Settings, add_extra_body_arg, served_model

TIMEOUT_S = 1800.0  # a request on a loaded CPU: minutes, not hours


def add_server_args(p: argparse.ArgumentParser, concurrency: int, max_tokens: int) -> None:
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="the model to ask for (default: the first of /v1/models)")
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY' "
                   "(default: $OPENAI_API_KEY, if set)")  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="the result JSON")
    p.add_argument("--label", help="the system's name in the result (default: the URL)")
    p.add_argument("--max-concurrency", type=int, default=concurrency, metavar="N",
                   help=f"requests in flight (default: {concurrency})")  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=max_tokens,
                   help=f"per answer (default: {max_tokens})")  # fmt: skip
    p.add_argument("--timeout", type=float, default=TIMEOUT_S,
                   help=f"seconds a request may take (default: {TIMEOUT_S:.0f})")  # fmt: skip
    p.add_argument(
        "--no-token-ids",
        action="store_true",
        help="do not ask for return_token_ids (a server that rejects the field)",
    )
    add_extra_body_arg(p)


def check_server_args(p: argparse.ArgumentParser, args: argparse.Namespace, *more: str) -> None:
    """Counts at least 1 (`more`: the command's own); the label defaults to the URL."""
    for key in ("max_concurrency", "max_tokens", *more):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')}: must be at least 1, got {getattr(args, key)}")
    args.label = args.label or args.base_url
    args.api_key = args.api_key or os.environ.get("OPENAI_API_KEY")


def session(args: argparse.Namespace) -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    return aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))


async def settings(args: argparse.Namespace) -> Settings:
    """The load client's settings: greedy chat, the model the server names first unless
    --model names one."""
    async with session(args) as s:
        model = args.model or await served_model(s, args.base_url, args.api_key)
    return Settings(args.base_url, model, "chat", args.max_tokens, 0.0, False,
                    not args.no_token_ids, args.api_key, args.extra_body)  # fmt: skip


def percent(share: float | None) -> str:
    """A share for a table: "12.3%", or "-" where the server gave none."""
    return "-" if share is None else f"{100 * share:.1f}%"
