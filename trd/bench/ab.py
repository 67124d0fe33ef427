"""`tokenrouterd bench ab --lever L`: does the prefix cache (or prefill ahead) slow down a
workload it cannot help? A paired A/B on one host.

Two daemons on the same pair run side by side, one with the lever off: `--lever
prefix_cache` (the default) compares the cache on against `prefix_cache: false`;
`--lever prefill_ahead` compares `prefill_ahead: true` against the default (off). Each
round sends 16 fresh short-workload prompts (no prompt is sent in two rounds) at N = 16
to both, the order alternating between rounds; the first round is a warm-up. A pair
whose short workload is chat (32 prompts, too few) gets 100-token prompts of held-out
text instead, with the workload's answer length unless `--max-tokens` says. Printed:
each round's tokens/s and on/off ratio, then the medians and ranges; `--out` keeps them
as JSON. The ratio's spread across rounds is the noise the median is judged against.
Each round's TTFT p50 of both daemons is kept too (what prefill ahead is for), and how
many of its requests the large model started (`large_first`: prefill ahead costs the
large model a prefill for each of the others).

    tokenrouterd bench ab --pair tiny --rounds 16 --out ab.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp

from trd.bench.compare.pairs import DEFAULT_TAU, PAIRS, load_pair
from trd.bench.compare.runner import Bench
from trd.bench.compare.systems import daemon_config, daemon_target
from trd.bench.compare.workloads import prompts
from trd.bench.result import Result
from trd.bench.server import Daemon, serve_config
from trd.bench.stats import percentile

N = 16
KV_TOKENS = N * 1400  # room for about four rounds: the pool fills with cached blocks
CONTEXT = 1024


LEVERS = {  # engine settings of the daemon with the lever on, and with it off
    "prefix_cache": ({}, {"prefix_cache": False}),
    "prefill_ahead": ({"prefill_ahead": True}, {}),
}


class Round(NamedTuple):
    rate: float  # output tokens/s
    ttft: float  # TTFT p50, seconds
    large_first: int  # requests whose first token the large model made


async def once(session: aiohttp.ClientSession, url: str, jobs: list[list[int]], n: int) -> Round:
    """Every job at once (`n` tokens each) against the daemon at `url`."""
    records, wall = await Bench.load(daemon_target(session, url, n), jobs, len(jobs), url)
    rate = sum(r.output_tokens for r in records) / wall
    large_first = sum((r.models or [])[:1] == ["large"] for r in records)
    return Round(rate, percentile((r.ttft or 0.0 for r in records), 50), large_first)


async def rounds(
    urls: dict[str, str], pool: list[list[int]], count: int, n: int
) -> list[dict[str, Any]]:
    out = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        for r in range(count + 1):
            jobs = pool[N * r : N * (r + 1)]
            order = ("on", "off") if r % 2 else ("off", "on")
            got = {name: await once(session, urls[name], jobs, n) for name in order}
            if r == 0:
                continue  # warm-up
            on, off = got["on"], got["off"]  # the same tokens: large_first is the same
            row = {"round": r, "first": order[0], "on": on.rate, "off": off.rate,
                   "ratio": on.rate / off.rate, "ttft_on": on.ttft, "ttft_off": off.ttft,
                   "ttft_ratio": on.ttft / off.ttft, "large_first": on.large_first}  # fmt: skip
            print(f"round {r:2}: on {on.rate:7.1f}  off {off.rate:7.1f} tok/s  "
                  f"on/off {row['ratio']:.3f}; TTFT p50 on {on.ttft:.2f} s  "
                  f"off {off.ttft:.2f} s; large first in {on.large_first} of {N}",
                  flush=True)  # fmt: skip
            out.append(row)
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def spread(key: str) -> dict[str, float]:
        values = [r[key] for r in rows]
        return {"median": percentile(values, 50), "min": min(values), "max": max(values)}

    return {
        **{k: spread(k) for k in ("on", "off", "ratio", "ttft_on", "ttft_off", "ttft_ratio")},
        "on_faster": sum(r["on"] > r["off"] for r in rows),
        "rounds": len(rows),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tokenrouterd bench ab", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--pair", choices=PAIRS, default="tiny")
    ap.add_argument("--lever", choices=LEVERS, default="prefix_cache",
                    help="the engine setting the two daemons differ in")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, help="tokens per answer (default: the workload's)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="the models' dtype (two float32 daemons of the demo pair need "
                         "about 27 GiB)")  # fmt: skip
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    command = ["tokenrouterd", "bench", "ab", *(sys.argv[3:] if argv is None else argv)]
    result = Result("bench ab", command)
    if args.rounds < 1 or (args.max_tokens is not None and args.max_tokens < 1):
        ap.error("--rounds and --max-tokens must be at least 1")
    pair = load_pair(args.pair)
    work = pair.workloads["short"]
    if work.source == "chat":  # its 32 prompts are too few to send fresh ones every round
        work = replace(work, source="corpus", prompt_tokens=100)
    max_tokens = args.max_tokens or work.max_tokens
    pool = prompts(pair.models["small"], work, N * (args.rounds + 1))
    random.Random(7).shuffle(pool)
    logs = Path(tempfile.mkdtemp(prefix=f"{args.lever}-ab-"))
    daemons: dict[str, Daemon] = {}
    try:
        for name, engine in zip(("on", "off"), LEVERS[args.lever], strict=True):
            cfg = daemon_config(
                pair.models, DEFAULT_TAU[args.pair], engine, KV_TOKENS, CONTEXT, args.dtype
            )
            print(f"starting the {args.lever}-{name} daemon (logs in {logs})", flush=True)
            result.system(f"{args.lever}_{name}", cfg)
            daemons[name] = serve_config(f"{args.lever}_{name}", cfg, logs)
        urls = {name: d.url for name, d in daemons.items()}
        rows = asyncio.run(rounds(urls, pool, args.rounds, max_tokens))
    finally:
        for d in daemons.values():
            d.stop()
    result.add(lever=args.lever, pair=args.pair, dtype=args.dtype, n=N,
               prompt_tokens=work.prompt_tokens, max_tokens=max_tokens, runs=rows,
               summary=summary(rows))  # fmt: skip
    s = summary(rows)
    ratio = s["ratio"]
    ttft = s["ttft_ratio"]
    print(f"{args.lever} on/off: tok/s median {ratio['median']:.3f} "
          f"[{ratio['min']:.3f}, {ratio['max']:.3f}], on faster in {s['on_faster']} of "
          f"{s['rounds']} rounds; TTFT p50 median {ttft['median']:.3f} "
          f"[{ttft['min']:.3f}, {ttft['max']:.3f}]")  # fmt: skip
    if args.out:
        print(f"wrote {result.write(args.out)}")
    return 0
