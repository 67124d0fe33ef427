"""Runs the agent workload (`agent.py`) on every system (its table: `agent_table.py`).

    official              one turn at a time (the research loop): the reference outputs
    tokenrouterd          the daemon, each engine's prefix cache on (the default)
    tokenrouterd_nocache  the daemon with `engine.prefix_cache: false`
    tokenrouterd_wide     the daemon with `engine.threads_alone` at the host's cores (as
                          its default config has it): a forward may use an idle peer's
                          cores, which no standard server can; not run unless named
    tokenrouterd_ahead    tokenrouterd_wide with `engine.prefill_ahead` (the 1.5B
                          prefills each turn as it arrives); not run unless named
    tokenrouterd_wide_nocache
                          tokenrouterd_wide without the prefix cache (the cache-off
                          daemon that the *_wide and *_ahead ones are judged against);
                          not run unless named
    std                   standard servers with their prefix cache + the HTTP dispatcher
    std_wide              the same, each server on torch threads for all the host's cores
                          (their forwards then share the cores uncoordinated); not run
                          unless named

At each N the same conversations run on every system; every turn's output ids and
producers are compared with the official loop's. TTFT is reported from the second
turn on (the first turn of a conversation has nothing of its own cached). The daemon's
measured hit rate is its entry engine's (every turn arrives there as a new request:
tokens matched / prompt tokens), next to `perfect_hits` of the same run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

from trd.bench.compare.agent import SHAPES, AgentShape, conversations, perfect_hits
from trd.bench.compare.ceiling import engine_work
from trd.bench.compare.pairs import Pair
from trd.bench.compare.systems import (
    CORES,
    ENGINE,
    THREADS,
    OfficialLoop,
    daemon_config,
    daemon_target,
    rstitch,
    start_std_servers,
    std_config,
)
from trd.bench.datasets import Conversation
from trd.bench.load import Target, run_load
from trd.bench.record import Record
from trd.bench.server import serve_config
from trd.bench.stats import percentile
from trd.bench.std.dispatcher import Dispatcher
from trd.bench.std.phases import delta

PAGE_SIZE = 16  # engine.page_size's default, and the standard server's
WARMUP_TOKENS = 4  # answer tokens of the warm-up turns
DAEMONS: dict[str, dict[str, Any]] = {
    "tokenrouterd": {},
    "tokenrouterd_nocache": {"prefix_cache": False},
    "tokenrouterd_wide": {"threads_alone": CORES},
    "tokenrouterd_ahead": {"threads_alone": CORES, "prefill_ahead": True},
    "tokenrouterd_wide_nocache": {"threads_alone": CORES, "prefix_cache": False},
}
SYSTEMS = ("official", *DAEMONS, "std", "std_wide")
DEFAULT_SYSTEMS = tuple(s for s in SYSTEMS if "_wide" not in s and "_ahead" not in s)
# (conversation, turn) -> seconds after the run's start before which the turn is not sent
Pace = dict[tuple[int, int], float]


def summarize(turns: Sequence[Record], wall: float) -> dict[str, Any]:
    """Throughput, TTFT from the second turn on (p50, p99), of first turns (p50), TPOT."""
    later = [r.ttft or 0.0 for r in turns if r.turn > 0]
    tokens = sum(r.output_tokens for r in turns)
    tpots = [t for r in turns if (t := r.tpot) is not None]
    return {
        "turns": len(turns), "wall_s": wall, "output_tokens": tokens, "throughput": tokens / wall,
        "ttft_p50": percentile(later, 50), "ttft_p99": percentile(later, 99),
        "ttft1_p50": percentile([r.ttft or 0.0 for r in turns if r.turn == 0], 50),
        "tpot_mean": sum(tpots) / len(tpots) if tpots else None,
    }  # fmt: skip


class AgentBench:
    def __init__(
        self,
        pair: Pair,
        tau: float,
        logs: Path,
        ns: tuple[int, ...] = (4, 16),
        shape: AgentShape | None = None,
        per_worker: int = 2,
        max_batch_tokens: int = ENGINE["max_batch_tokens"],
        pace: dict[int, Pace] | None = None,
    ):
        self.pair, self.tau, self.logs, self.ns = pair, tau, logs, ns
        self.max_batch_tokens = max_batch_tokens  # every system's engines
        self.shape, self.per_worker = shape or SHAPES[pair.name], per_worker
        # Each N runs conversations of its own (per_worker each, one after the other: the
        # next starts while the others are under way), and one more warms up.
        self.first, total = {}, 0
        for n in ns:
            self.first[n], total = total, total + per_worker * n
        self.pace = pace or {}  # per N: (conversation, turn) -> earliest send, seconds
        for n in set(ns) & set(self.pace):
            convs = range(self.first[n], self.first[n] + per_worker * n)
            if set(self.pace[n]) != {(c, t) for c in convs for t in range(self.shape.turns)}:
                raise ValueError(
                    f"--agent-pace: the earlier run's turns at N={n} are not this run's (it "
                    "needs the same --agent-n, --agent-per-worker and --agent-turns)"
                )
        self.convs = conversations(pair.models["small"], self.shape, total + 1)
        self.context = self.shape.longest + 16
        self.kv_tokens = 2 * max(ns) * self.context  # room for N conversations, twice over
        self.reference: dict[tuple[int, int], tuple[list[int], list[str]]] = {}
        self.runs: list[dict[str, Any]] = []
        self.systems: dict[str, dict[str, Any]] = {}  # each system's config, by name

    def batch(self, n: int) -> list[Conversation]:
        """The conversations of the run at N = n."""
        return self.convs[self.first[n] : self.first[n] + self.per_worker * n]

    async def run_all(self, systems: Sequence[str] = DEFAULT_SYSTEMS) -> dict[str, Any]:
        """The systems named (in SYSTEMS' order); the first one run is the reference every
        later turn is compared with (the official loop, unless it is left out)."""
        started = time.perf_counter()
        if "official" in systems:
            await self.run_official()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            for name, engine in DAEMONS.items():
                if name in systems:
                    await self.run_daemon(session, name, engine)
            if "std" in systems:
                await self.run_std(session, "std", THREADS)
            if "std_wide" in systems:
                await self.run_std(session, "std_wide", CORES)
        return {"shape": asdict(self.shape), "page_size": PAGE_SIZE, "tau": self.tau,
                "max_batch_tokens": self.max_batch_tokens,
                "total_s": time.perf_counter() - started, "runs": self.runs}  # fmt: skip

    def record(self, system: str, n: int, turns: list[Record], wall: float) -> dict[str, Any]:
        if bad := next((r for r in turns if not r.ok), None):
            raise RuntimeError(f"{system} N={n}: a turn failed: {bad.error}")
        if not self.runs and not self.reference:  # the official loop was left out
            self.reference = {(t.conversation, t.turn): (t.token_ids or [], t.models or [])
                              for t in turns}  # fmt: skip
        wrong = [
            t
            for t in turns
            if self.reference.get((t.conversation, t.turn)) != (t.token_ids, t.models)
        ]
        hits, asked = perfect_hits(turns, PAGE_SIZE)
        run = {"system": system, "n": n, **summarize(turns, wall), "perfect_hit_rate": hits / asked,
               "diverging_turns": len(wrong), "turn_log": turn_log(turns)}  # fmt: skip
        self.runs.append(run)
        with (self.logs / "agent_runs.jsonl").open("a") as f:  # kept if a later system fails
            f.write(json.dumps(run) + "\n")
        print(f"{system:22} N={n:<3} TTFT(t>=2) p50 {1e3 * run['ttft_p50']:8.1f} ms  "
              f"{run['throughput']:7.1f} tok/s  diverging {len(wrong)}", flush=True)  # fmt: skip
        return run

    async def run_official(self) -> None:
        loop = OfficialLoop(self.pair.models, rstitch(self.tau), self.shape.answer_tokens)
        self.systems["official"] = loop.config()
        turns, wall = await run_load(loop, self.convs[:-1], max_concurrency=1, label="official")
        for t in turns:
            self.reference[(t.conversation, t.turn)] = (t.token_ids or [], t.models or [])
        self.record("official", 1, turns, wall)

    async def run_daemon(
        self, session: aiohttp.ClientSession, name: str, engine: dict[str, Any]
    ) -> None:
        engine = {"max_batch_tokens": self.max_batch_tokens, **engine}
        cfg = daemon_config(self.pair.models, self.tau, engine, self.kv_tokens, self.context)
        self.systems[name] = cfg
        d = serve_config(name, cfg, self.logs)
        target = daemon_target(session, d.url, self.shape.answer_tokens)
        try:
            await self.warmup(daemon_target(session, d.url, WARMUP_TOKENS))
            for n in self.ns:
                before = d.fresh_stats(time.time())
                turns, wall = await self.conversations(target, n)
                after = d.fresh_stats(time.time())
                run = self.record(name, n, turns, wall)
                run["hit_rate"] = hit_rate(before, after)
                run["work"] = {m: engine_work(before.get(m, {}), after[m]) for m in after}
                run["steps"] = {m: step_log(before.get(m, {}), after[m]) for m in after}
        finally:
            d.stop()

    async def run_std(self, session: aiohttp.ClientSession, name: str, threads: int) -> None:
        servers = start_std_servers(
            name, self.pair.models, self.logs, True, self.kv_tokens, self.max_batch_tokens, threads
        )
        self.systems[name] = std_config(self.pair.models, self.tau, True, self.kv_tokens,
                                        self.max_batch_tokens, threads)  # fmt: skip
        try:
            urls = [servers[m].url for m in self.pair.models]
            names = list(self.pair.models)
            target = Dispatcher(session, urls, names, self.tau, self.shape.answer_tokens)
            await self.warmup(Dispatcher(session, urls, names, self.tau, WARMUP_TOKENS))
            for n in self.ns:
                before = {m: s.get_json("/profile") for m, s in servers.items()}
                turns, wall = await self.conversations(target, n)
                run = self.record(name, n, turns, wall)
                after = {m: s.get_json("/profile") for m, s in servers.items()}
                run["profile"] = {m: delta(before[m], after[m]) for m in servers}
        finally:
            for s in servers.values():
                s.stop()

    async def conversations(self, target: Target, n: int) -> tuple[list[Record], float]:
        """The run at N = n, its turns numbered as in the reference."""
        first = self.first[n]
        pace = {(c - first, t): s for (c, t), s in self.pace.get(n, {}).items()}
        turns, wall = await run_load(target, self.batch(n), max_concurrency=n, pace=pace,
                                     label=f"N={n}")  # fmt: skip
        for t in turns:
            t.conversation += first
        return turns, wall

    async def warmup(self, target: Target) -> None:
        """Two short unrelated requests (`target` answers WARMUP_TOKENS): the models are
        loaded and the first forwards run."""
        last = self.convs[-1]
        warm = Conversation((last.turns[1],), last.turns[0])
        await run_load(target, [warm, warm], max_concurrency=2, label="warmup")


def turn_log(turns: Sequence[Record]) -> list[dict[str, Any]]:
    """Each turn's timing and who made its first token (seconds from the run's first send),
    to see where a slow first token waited."""
    start = min(t.sent for t in turns)
    return [
        {"conv": t.conversation, "turn": t.turn, "sent_s": t.sent - start, "ttft_s": t.ttft,
         "latency_s": t.latency, "prompt": len(t.prompt_ids or []),
         "first": t.models[0] if t.models else None,
         "tokens_per_model": {k: v for k, v in (t.tokens_per_model or {}).items() if v}}
        for t in sorted(turns, key=lambda t: t.sent)
    ]  # fmt: skip


def read_pace(path: Path, system: str = "std") -> dict[int, Pace]:
    """Per N, when `system` sent each turn in an earlier agent run's JSON (`turn_log`);
    ValueError, naming the file, if it cannot be read as one."""
    try:
        runs = json.loads(path.read_text())["runs"]
        return {
            r["n"]: {(e["conv"], e["turn"]): e["sent_s"] for e in r["turn_log"]}
            for r in runs
            if r["system"] == system and "turn_log" in r
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--agent-pace: {path} is not an agent run's JSON ({exc!r})") from exc


def step_log(before: dict[str, Any], after: dict[str, Any]) -> list[list[float]]:
    """The run's steps on one engine, [rows, seconds, tokens fed] each (the stats window
    holds the latest WINDOW; an older step that fell out of it is not listed)."""
    count = int(after.get("steps", 0)) - int(before.get("steps", 0))
    window = after.get("window", {})
    latency, fed = window.get("latency", []), window.get("fed", [])
    count = min(count, len(latency), len(fed))
    pairs = zip(latency[len(latency) - count :], fed[len(fed) - count :], strict=True)
    return [[rows, seconds, f] for (rows, seconds), f in pairs]


def hit_rate(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Tokens matched / prompt tokens looked up, per engine, between two stats snapshots."""
    out = {}
    for name, body in after.items():
        a, b = body.get("prefix_cache"), before.get(name, {}).get("prefix_cache")
        if a and b and a["queries"] > b["queries"]:
            out[name] = (a["hits"] - b["hits"]) / (a["queries"] - b["queries"])
    return out
