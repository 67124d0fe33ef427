"""Long mixed load with each process's memory sampled: `bench serve --duration`.

    tokenrouterd bench serve --base-url http://127.0.0.1:8000 --admin 127.0.0.1:8001 \\
        --duration 60m --mix soak --max-concurrency 8 --out soak.json

N workers (`--max-concurrency`, default 8) each send the mix's next request (`mix.py`) as
soon as their last one ended, until `--duration` is over. Every `--sample-every` (default
one minute), and at both ends, the daemon's admin API (`GET /status`) gives the resident
memory and heap of the supervisor and of each engine, and each engine's live structures:
KV pages in use, prefix-cache blocks, requests held, compiled grammars kept, finished
request ids remembered. The last sample waits (up to SETTLE_S) until the daemon holds no
request: what it still holds then was left behind. Without `--admin` (a server that is
not ours) nothing is sampled.

Outcomes: ok; cut (the client closed the stream on purpose); refused (a 4xx for a
request that carried a bad field, the right answer); errors (anything else: a 5xx, a
lost connection, a bad field served, a good request refused).

Growth, per process: the least-squares slope of its resident bytes over the samples
taken after `--warmup` (default 10 minutes), times the span of those samples, as a
percentage of its resident bytes at the first of them; the same for its anonymous
bytes (what a leak grows: file pages, the mapped weights, the kernel may drop and read
again under memory pressure, which moves the resident size both ways on a busy host).
The run fails (exit status 1) on any error, when either growth of a process is above
`--max-growth` percent (default 1), or when the daemon still held a request or a KV
page once the load had ended.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import aiohttp

from trd.bench.client import ENDPOINTS, Client, Settings, served_model
from trd.bench.metrics import summarize
from trd.bench.mix import Shaped, SoakMix
from trd.bench.record import Record, digest_prompt
from trd.bench.result import Result
from trd.bench.samples import Sample, growth, left_behind, sample_loop, settle


def parse_duration(text: str) -> float:
    """Seconds of "90", "90s", "15m", "2h"; ValueError naming the value otherwise."""
    units = {"s": 1, "m": 60, "h": 3600}
    number, unit = (text[:-1], units[text[-1]]) if text[-1:] in units else (text, 1)
    try:
        seconds = float(number) * unit
    except ValueError:
        raise ValueError(f"{text!r} is not a duration such as 90s, 15m or 2h") from None
    if not seconds > 0:
        raise ValueError(f"{text!r}: a duration must be above 0")
    return seconds


def duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def outcome(shaped: Shaped, rec: Record) -> str:
    """ok, cut, refused (a bad field answered with a 4xx) or error."""
    if shaped.bad is not None:
        return "refused" if (rec.error or "").startswith("HTTP 4") else "error"
    return "cut" if rec.cut else "ok" if rec.ok else "error"


async def drive(
    clients: dict[str, Client], mix: SoakMix, seconds: float, workers: int, start: float,
    out: list[tuple[Shaped, Record]],
) -> None:  # fmt: skip
    """`workers` closed loops over the mix until `seconds` after `start` (perf_counter);
    each request and its record go to `out` as it ends."""
    index = itertools.count()

    async def worker() -> None:
        while time.perf_counter() - start < seconds:
            i = next(index)
            shaped = mix.request(i)
            body = shaped.body
            rec = Record(i, 0, digest_prompt(body.get("prompt", body.get("messages"))),
                         time.perf_counter() - start)  # fmt: skip
            await clients[shaped.endpoint].send(body, rec, shaped.cut_after)
            out.append((shaped, rec))

    await asyncio.gather(*(worker() for _ in range(workers)))


async def soak(
    clients: dict[str, Client], mix: SoakMix, seconds: float, workers: int,
    admin: str | None, token: str, every: float,
) -> tuple[list[tuple[Shaped, Record]], list[Sample], float]:  # fmt: skip
    """The run: its requests, its samples (none without `admin`), its wall time."""
    start = time.perf_counter()
    samples: list[Sample] = []
    results: list[tuple[Shaped, Record]] = []
    load = asyncio.create_task(drive(clients, mix, seconds, workers, start, results))
    if admin is not None:
        await sample_loop(admin, token, every, start + seconds, start, results, samples)
    await load
    if admin is not None:  # the end, once every request has left the engines (or not)
        await settle(admin, token)
        await sample_loop(admin, token, every, 0.0, start, results, samples)
    return results, samples, time.perf_counter() - start


def outcomes(results: Sequence[tuple[Shaped, Record]]) -> dict[str, int]:
    counts = Counter(outcome(s, r) for s, r in results)
    return {k: counts[k] for k in ("ok", "cut", "refused", "error")}


def first_error(results: Sequence[tuple[Shaped, Record]]) -> str | None:
    for shaped, rec in results:
        if outcome(shaped, rec) == "error":
            field = f" (bad field {shaped.bad})" if shaped.bad else ""
            return f"request {rec.conversation}{field}: {rec.error or 'answered 200'}"
    return None


def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("long load (trd/bench/soak.py)")
    g.add_argument("--duration", type=duration_arg, metavar="D",
                   help="send the --mix for D (90s, 15m, 2h) instead of --num-prompts")  # fmt: skip
    g.add_argument("--mix", choices=("soak",), default="soak",
                   help="request shapes: soak = chat and completions, streamed or not, "
                   "cut, bad fields, grammars, shared prefixes (trd/bench/mix.py)")  # fmt: skip
    g.add_argument("--admin", metavar="ADDR",
                   help="the daemon's admin API (host:port or unix:PATH): sample its "
                   "processes' memory and live structures (default: no samples)")  # fmt: skip
    g.add_argument("--admin-token", default=os.environ.get("TRCTL_ADMIN_TOKEN", ""),
                   help="the daemon's admin_token (default: $TRCTL_ADMIN_TOKEN)")  # fmt: skip
    g.add_argument("--sample-every", type=duration_arg, default=60.0, metavar="D",
                   help="default 60s")  # fmt: skip
    g.add_argument("--warmup", type=duration_arg, default=600.0, metavar="D",
                   help="growth is judged on the samples after it (default 10m)")  # fmt: skip
    g.add_argument("--grammars", type=float, default=0.1, metavar="SHARE",
                   help="share of the requests with a grammar (default 0.1)")  # fmt: skip
    g.add_argument("--max-growth", type=float, default=1.0, metavar="PCT",
                   help="fail when a process grew more after the warm-up (default 1)")  # fmt: skip


async def measure(args: argparse.Namespace, api_key: str | None) -> dict[str, Any]:
    """The long-load run of `args` against `args.base_url`, as a result's run."""
    timeout, connector = aiohttp.ClientTimeout(total=args.timeout), aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        model = args.model or await served_model(session, args.base_url, api_key)
        settings = Settings(args.base_url, model, token_ids=not args.no_token_ids,
                            api_key=api_key)  # fmt: skip
        clients = {e: Client(session, dataclasses.replace(settings, endpoint=e))
                   for e in ENDPOINTS}  # fmt: skip
        mix = SoakMix(model, args.seed, args.grammars, settings.token_ids)
        workers = args.max_concurrency or 8
        results, samples, wall = await soak(clients, mix, args.duration, workers, args.admin,
                                            args.admin_token, args.sample_every)  # fmt: skip
    records = [r for _, r in results]
    counts = outcomes(results)
    return {
        "system": args.label or args.base_url,
        "settings": {"base_url": args.base_url, "model": model, "mix": args.mix,
                     "duration_s": args.duration, "max_concurrency": workers,
                     "seed": args.seed, "grammars": args.grammars, "admin": args.admin,
                     "sample_every_s": args.sample_every, "warmup_s": args.warmup},
        "summary": {**summarize(records, wall), "failed": counts["error"],
                    "outcomes": counts, "first_error": first_error(results)},
        "samples": samples, "left_behind": left_behind(samples),
        "growth": {key: growth(samples, args.warmup, key)
                   for key in ("rss_bytes", "anon_bytes", "heap_in_use_bytes")},
        "records": [{**r.to_dict(), "endpoint": s.endpoint, "stream": s.body["stream"],
                     "bad": s.bad} for s, r in results],
    }  # fmt: skip


def table(run: dict[str, Any], max_growth: float) -> tuple[list[str], bool]:
    """The run's lines, and whether it passed: no error, no process grew too much."""
    s, cfg = run["summary"], run["settings"]
    o = s["outcomes"]
    lines = [
        f"==== bench serve --mix {cfg['mix']}: {cfg['base_url']} ({cfg['model']}) ====",
        f"{s['requests']} requests in {s['duration_s'] / 60:.1f} min, concurrency "
        f"{cfg['max_concurrency']}: {o['ok']} ok, {o['cut']} cut by the client, "
        f"{o['refused']} bad fields refused, {o['error']} errors",
    ]
    if s["first_error"]:
        lines.append(f"first error: {s['first_error']}")
    rss, anon = run["growth"]["rss_bytes"], run["growth"]["anon_bytes"]
    if not rss:
        note = "no --admin to sample" if cfg["admin"] is None else "too few samples after it"
        lines.append(f"growth after the {cfg['warmup_s'] / 60:g} min warm-up: - ({note})")
    else:
        lines.append(f"after the {cfg['warmup_s'] / 60:g} min warm-up (growth in % of the "
                     f"resident size, limit {max_growth:g}%):")  # fmt: skip
        for name, g in rss.items():
            a = anon.get(name, {})
            lines.append(f"  {name:12} resident {g['first'] / 2**20:9,.0f} -> "
                         f"{g['last'] / 2**20:9,.0f} MiB  slope "
                         f"{g['slope_per_h'] / 2**20:+8.1f} MiB/h  {_pct(g)}, "
                         f"anonymous {_pct(a)}")  # fmt: skip
    grew = [n for n in rss
            if max(_num(rss[n]), _num(anon.get(n, {}))) > max_growth]  # fmt: skip
    if grew:
        lines.append(f"grew more than {max_growth:g}%: {', '.join(grew)}")
    left = run["left_behind"]
    if left:
        lines.append("left behind once the load ended: "
                     + ", ".join(f"{k} {v}" for k, v in left.items()))  # fmt: skip
    return lines, o["error"] == 0 and not grew and not left


def _num(g: dict[str, Any]) -> float:
    return g.get("growth_pct") or 0.0


def _pct(g: dict[str, Any]) -> str:
    return "-" if g.get("growth_pct") is None else f"{g['growth_pct']:+.2f}%"


def main(args: argparse.Namespace, command: list[str] | None, api_key: str | None) -> int:
    """`bench serve --duration`: run, print, write the result; 0 when it passed."""
    result = Result("bench serve", command)
    try:
        run = asyncio.run(measure(args, api_key))
    except (aiohttp.ClientError, RuntimeError, OSError) as exc:
        print(f"tokenrouterd bench serve: {args.base_url}: {exc}", file=sys.stderr)
        return 1
    result.system(run["system"], {"base_url": args.base_url, "model": run["settings"]["model"]})
    result.run(run)
    lines, passed = table(run, args.max_growth)
    print("\n".join(lines))
    if args.out:
        print(f"wrote {result.write(args.out)}")
    return 0 if passed else 1
