"""Runs the agent workload (`agent.py`) on every system and makes its table.

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
import numpy as np

from trd.bench.server import serve_config
from trd.bench.stats import percentile
from trd.bench.std.phases import delta
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.testing.reference import ReferenceRouter

from baselines.dispatcher import Dispatcher
from benchkit.agent import (
    SHAPES,
    AgentShape,
    Conversation,
    Pace,
    Turn,
    closed_loop_conversations,
    conversations,
    perfect_hits,
)
from benchkit.ceiling import engine_work
from benchkit.client import OpenAIClient, Record
from benchkit.pairs import Pair
from benchkit.systems import (
    CORES,
    DTYPE,
    ENGINE,
    THREADS,
    daemon_config,
    start_std_servers,
)

MODEL = "small+large"
PAGE_SIZE = 16  # engine.page_size's default, and the standard server's
DAEMONS: dict[str, dict[str, Any]] = {
    "tokenrouterd": {},
    "tokenrouterd_nocache": {"prefix_cache": False},
    "tokenrouterd_wide": {"threads_alone": CORES},
    "tokenrouterd_ahead": {"threads_alone": CORES, "prefill_ahead": True},
    "tokenrouterd_wide_nocache": {"threads_alone": CORES, "prefix_cache": False},
}
SYSTEMS = ("official", *DAEMONS, "std", "std_wide")
DEFAULT_SYSTEMS = tuple(s for s in SYSTEMS if "_wide" not in s and "_ahead" not in s)
# The daemons with the cache on that the table judges, each against its cache-off twin.
CACHE_OFF = {
    "tokenrouterd": "tokenrouterd_nocache",
    "tokenrouterd_wide": "tokenrouterd_wide_nocache",
    "tokenrouterd_ahead": "tokenrouterd_wide_nocache",
}


def summarize(turns: list[list[Turn]], wall: float) -> dict[str, Any]:
    later = [t.record for conv in turns for t in conv[1:]]
    every = [t.record for conv in turns for t in conv]
    tokens = sum(r.output_tokens for r in every)
    return {
        "turns": len(every), "wall_s": wall, "output_tokens": tokens, "throughput": tokens / wall,
        "ttft_p50": percentile([r.ttft for r in later], 50),
        "ttft_p99": percentile([r.ttft for r in later], 99),
        "ttft1_p50": percentile([c[0].record.ttft for c in turns], 50),
        "tpot_mean": float(np.mean([r.tpot for r in every])),
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
        sizes = [per_worker * n for n in ns]
        self.first = dict(zip(ns, np.cumsum([0, *sizes]).tolist(), strict=False))
        self.pace = pace or {}  # per N: (conversation, turn) -> earliest send, seconds
        for n in set(ns) & set(self.pace):
            convs = range(self.first[n], self.first[n] + per_worker * n)
            if set(self.pace[n]) != {(c, t) for c in convs for t in range(self.shape.turns)}:
                raise ValueError(
                    f"--agent-pace: the earlier run's turns at N={n} are not this run's (it "
                    "needs the same --agent-n, --agent-per-worker and --agent-turns)"
                )
        total = sum(sizes)
        self.convs = conversations(pair.models["small"], self.shape, total + 1)
        self.context = self.shape.longest + 16
        self.kv_tokens = 2 * max(ns) * self.context  # room for N conversations, twice over
        self.reference: dict[tuple[int, int], tuple[list[int], list[str]]] = {}
        self.runs: list[dict[str, Any]] = []

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

    def record(self, system: str, n: int, turns: list[list[Turn]], wall: float) -> dict[str, Any]:
        every = [t for conv in turns for t in conv]
        if not self.runs and not self.reference:  # the official loop was left out
            self.reference = {(t.conv, t.index): (t.record.token_ids, t.record.models)
                              for t in every}  # fmt: skip
        wrong = [
            t
            for t in every
            if self.reference.get((t.conv, t.index)) != (t.record.token_ids, t.record.models)
        ]
        hits, asked = perfect_hits(every, PAGE_SIZE)
        run = {"system": system, "n": n, **summarize(turns, wall), "perfect_hit_rate": hits / asked,
               "diverging_turns": len(wrong), "turn_log": turn_log(every)}  # fmt: skip
        self.runs.append(run)
        with (self.logs / "agent_runs.jsonl").open("a") as f:  # kept if a later system fails
            f.write(json.dumps(run) + "\n")
        print(f"{system:22} N={n:<3} TTFT(t>=2) p50 {1e3 * run['ttft_p50']:8.1f} ms  "
              f"{run['throughput']:7.1f} tok/s  diverging {len(wrong)}", flush=True)  # fmt: skip
        return run

    async def run_official(self) -> None:
        paths = [self.pair.models[m] for m in self.pair.models]
        names = list(self.pair.models)
        policy = PolicySpec("rstitch", {"threshold": self.tau})
        router = ReferenceRouter(paths, policy, DTYPE, kv_cache=True)

        async def send(prompt: list[int], max_tokens: int) -> Record:
            out = router.run(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            return Record(prompt, out.ttft, out.latency, out.tokens, [names[m] for m in out.models])

        turns, wall = await closed_loop_conversations(
            send, self.convs[:-1], self.shape.answer_tokens, 1
        )
        for conv in turns:
            for t in conv:
                self.reference[(t.conv, t.index)] = (t.record.token_ids, t.record.models)
        self.record("official", 1, turns, wall)

    async def run_daemon(
        self, session: aiohttp.ClientSession, name: str, engine: dict[str, Any]
    ) -> None:
        engine = {"max_batch_tokens": self.max_batch_tokens, **engine}
        cfg = daemon_config(self.pair.models, self.tau, engine, self.kv_tokens, self.context)
        d = serve_config(name, cfg, self.logs)
        send = OpenAIClient(session, d.url, MODEL).send
        try:
            await self.warmup(send)
            for n in self.ns:
                before = d.fresh_stats(time.time())
                turns, wall = await self.conversations(send, n)
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
        try:
            urls = [servers[m].url for m in self.pair.models]
            send = Dispatcher(session, urls, list(self.pair.models), self.tau).send
            await self.warmup(send)
            for n in self.ns:
                before = {m: s.get_json("/profile") for m, s in servers.items()}
                turns, wall = await self.conversations(send, n)
                run = self.record(name, n, turns, wall)
                after = {m: s.get_json("/profile") for m, s in servers.items()}
                run["profile"] = {m: delta(before[m], after[m]) for m in servers}
        finally:
            for s in servers.values():
                s.stop()

    async def conversations(self, send: Any, n: int) -> tuple[list[list[Turn]], float]:
        first = self.first[n]
        pace = {(c - first, t): s for (c, t), s in self.pace.get(n, {}).items()}
        turns, wall = await closed_loop_conversations(
            send, self.batch(n), self.shape.answer_tokens, n, pace
        )
        for conv in turns:  # numbered as in the reference
            for t in conv:
                t.conv += self.first[n]
        return turns, wall

    async def warmup(self, send: Any) -> None:
        """Two short unrelated requests: the models are loaded and the first forwards run."""
        warm = Conversation(self.convs[-1].tools[0], [self.convs[-1].tools[1]])
        await closed_loop_conversations(send, [warm, warm], 4, 2)


def turn_log(turns: Sequence[Turn]) -> list[dict[str, Any]]:
    """Each turn's timing and who made its first token (seconds from the run's first send),
    to see where a slow first token waited."""
    start = min(t.sent for t in turns)
    return [
        {"conv": t.conv, "turn": t.index, "sent_s": t.sent - start, "ttft_s": t.record.ttft,
         "latency_s": t.record.latency, "prompt": len(t.record.prompt),
         "first": t.record.models[0] if t.record.models else None,
         "tokens_per_model": t.record.tokens_per_model}
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


def agent_table(result: dict[str, Any]) -> list[str]:
    """The markdown table of an agent run, then each N's targets, met or missed."""
    lines = [
        "| system | N | TTFT p50 turn>=2 (ms) | TTFT p99 turn>=2 (ms) | TTFT p50 turn 1 (ms) "
        "| TPOT (ms) | output tok/s | hit rate: entry engine / perfect | diverging turns |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        hit = r.get("hit_rate", {}).get("small")
        hits = f"{hit:.1%} / {r['perfect_hit_rate']:.1%}" if hit is not None else "-"
        lines.append(
            f"| {r['system']} | {r['n']} | {1e3 * r['ttft_p50']:.1f} | {1e3 * r['ttft_p99']:.1f} "
            f"| {1e3 * r['ttft1_p50']:.1f} | {1e3 * r['tpot_mean']:.2f} | {r['throughput']:.1f} "
            f"| {hits} | {r['diverging_turns']}/{r['turns']} |"
        )
    by = {(r["system"], r["n"]): r for r in result["runs"]}
    for n in sorted({r["n"] for r in result["runs"]}):
        for name, off_name in CACHE_OFF.items():
            if (on := by.get((name, n))) is not None:
                parts = targets(on, by.get((off_name, n)), by.get(("std", n)))
                if (wide := by.get(("std_wide", n))) is not None:
                    parts.append(f"std_wide: {1e3 * wide['ttft_p50']:.1f} ms")
                label = f"N={n}" if name == "tokenrouterd" else f"N={n}, {name}"
                lines.append(f"- {label}: " + "; ".join(parts))
    return lines


def targets(
    on: dict[str, Any], off: dict[str, Any] | None, std: dict[str, Any] | None
) -> list[str]:
    """The targets of one cache-on daemon's run, against its cache-off twin and standard
    serving where the run has them."""
    parts = []
    if off is not None:
        ttft, tput = off["ttft_p50"] / on["ttft_p50"], on["throughput"] / off["throughput"]
        parts += [f"TTFT p50 (turn >= 2) {ttft:.1f}x lower with the cache (target 5x: "
                  f"{met(ttft >= 5)})", f"throughput {tput:.2f}x (target 2x: "
                  f"{met(tput >= 2)})"]  # fmt: skip
    if std is not None:
        ok = met(on["ttft_p50"] <= std["ttft_p50"])
        parts.append(f"TTFT {1e3 * on['ttft_p50']:.1f} ms vs standard serving's "
                     f"{1e3 * std['ttft_p50']:.1f} ms (target <=: {ok})")  # fmt: skip
    measured = on.get("hit_rate", {}).get("small")
    if measured is None:  # the entry engine's counters did not move between snapshots
        parts.append("hit rate not measured (target 90%: not judged)")
    else:
        hit = measured / on["perfect_hit_rate"]
        parts.append(f"hit rate {hit:.0%} of perfect (target 90%: {met(hit >= 0.9)})")
    return parts


def met(ok: bool) -> str:
    return "met" if ok else "missed"
