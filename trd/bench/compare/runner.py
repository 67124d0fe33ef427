"""Runs every system on every workload of a plan and collects the results.

    official  the reference: every prompt any system serves, at the longest length it
              is served with (`trd/bench/identity.py`)
    tokenrouterd  thresholds all 1 (= no_delayed_batching), then the Markov model's
              recommendation: the N sweep, the length sweep, agent; then forced_delay
    ablation daemons (full plan), standard serving (std: prefix cache, std_nocache: none)

Each run: a closed loop at N; every record's output (ids + producers) is compared with
the reference as it comes in; a summary; daemons add the forward ceiling from their
engines' counters (`ceiling.py`), standard servers the per-phase profile of each server.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import aiohttp

from trd.bench.compare.ceiling import bound_kind, ceiling
from trd.bench.compare.pairs import Pair
from trd.bench.compare.plan import Plan
from trd.bench.compare.stepcost import batching_bound, calibrate
from trd.bench.compare.systems import (
    DTYPE,
    ENGINE,
    THREADS,
    OfficialLoop,
    cpu_linear,
    daemon_config,
    daemon_target,
    rstitch,
    start_std_servers,
    std_config,
)
from trd.bench.compare.workloads import Workload, prompts
from trd.bench.datasets import Conversation
from trd.bench.identity import Reference, identity
from trd.bench.load import Target, run_load
from trd.bench.metrics import summarize
from trd.bench.record import Record
from trd.bench.server import Daemon, Server, serve_config
from trd.bench.std.dispatcher import Dispatcher
from trd.bench.std.phases import delta
from trd.cli import AdminError

FORCED_DELAY = [1, 1, 1, 2, 2, 2, 2, 4]  # the large model's B by active requests (8+: 4)
STD = {"std": True, "std_nocache": False}  # standard-serving systems: prefix cache on?
ABLATIONS = {
    "no_pending_kv": {"pending_kv": False, "prefix_cache": False},  # the cache would refill it
    "step_sync": {"step_sync": True},
}
Make = Callable[[int], Target]  # a system's target for requests of max_tokens tokens


class Bench:
    def __init__(self, plan: Plan, pair: Pair, tau: float, logs: Path) -> None:
        self.plan, self.pair, self.tau, self.logs = plan, pair, tau, logs
        self.models, self.names = pair.models, list(pair.models)
        self.reference = Reference()
        self.runs: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.systems: dict[str, dict[str, Any]] = {}  # each system's config, by name
        self.thresholds: dict[str, list[int]] = {}
        self.recommendation: dict[str, Any] = {}  # the Markov model's full answer
        self.costs: dict[str, dict[str, Any]] = {}  # each model's step costs (`stepcost.py`)
        self._prompts: dict[tuple[Any, ...], list[list[int]]] = {}
        self.bound = bound_kind("cpu", os.cpu_count() or 1, len(self.models), THREADS)
        # Room for the longest request of any run, N of them at once.
        longest = max(len(p) for w, c in self.reference_jobs() for p in self.prompts(w, c))
        longest += max(w.max_tokens for w, _ in self.reference_jobs())
        self.context = longest + 16
        self.kv_tokens = self.top_n * self.context

    # -- workloads -------------------------------------------------------------------
    @property
    def top_n(self) -> int:
        return max(self.plan.ns)

    def workload(self, name: str, max_tokens: int | None = None) -> Workload:
        w = self.pair.workloads[name]
        scaled = self.plan.tokens(w.prompt_tokens) if w.prompt_tokens else 0
        w = replace(w, prompt_tokens=scaled, max_tokens=self.plan.tokens(w.max_tokens))
        return w if max_tokens is None else w.with_max_tokens(max_tokens)

    def prompts(self, w: Workload, count: int) -> list[list[int]]:
        key = (w.source, w.prompt_tokens, w.seed)
        if len(self._prompts.get(key, [])) < count:
            self._prompts[key] = prompts(self.models["small"], w, count)
        return self._prompts[key][:count]

    def reference_jobs(self) -> list[tuple[Workload, int]]:
        """Every prompt list the plan serves, at the longest length it is served with."""
        jobs = [(self.workload("short"), self.plan.requests(self.top_n))]
        if self.plan.long:
            jobs.append((self.workload("long", self.plan.long), self.top_n))
        if "agent" in self.pair.workloads and self.plan.agent_requests:
            jobs.append((self.workload("agent"), self.plan.agent_requests))
        return jobs

    # -- one run ---------------------------------------------------------------------
    async def measure(
        self, system: str, make: Make, w: Workload, n: int, count: int, *,
        daemon: Daemon | None = None, repeats: int = 1, std: dict[str, Server] | None = None,
        reference: bool = False,
    ) -> dict[str, Any]:  # fmt: skip
        """Run `repeats` times and keep the fastest (the host is shared: noise only slows);
        every repeat's outputs are kept for the identity check."""
        runs = [await self._measure_once(system, make, w, n, count, daemon, std, reference)
                for _ in range(repeats)]  # fmt: skip
        best = max(runs, key=lambda r: r["output_throughput"])
        best["throughputs"] = [r["output_throughput"] for r in runs]
        best["other_repeats"] = [r["records"] for r in runs if r is not best]
        self.runs.append(best)
        return best

    async def _measure_once(
        self, system: str, make: Make, w: Workload, n: int, count: int,
        daemon: Daemon | None, std: dict[str, Server] | None, reference: bool,
    ) -> dict[str, Any]:  # fmt: skip
        jobs = self.prompts(w, count)
        before = daemon.fresh_stats(time.time()) if daemon else None
        profiles = {m: s.get_json("/profile") for m, s in (std or {}).items()}
        records, wall = await self.load(make(w.max_tokens), jobs, n, f"{system} {w.name} N={n}")
        run = {
            "system": system, "workload": w.name, "source": w.source, "max_tokens": w.max_tokens,
            "n": n, "prompt_tokens_mean": sum(map(len, jobs)) / len(jobs),
            **summarize(records, wall), "records": [self._record(r, reference) for r in records],
        }  # fmt: skip
        if reference:
            run["reference"] = True
        if daemon and before is not None:
            after = daemon.fresh_stats(time.time())
            run["ceiling"] = ceiling(before, after, records, wall, self.bound)
            run["batching"] = batching_bound(before, after, self.costs, wall, self.bound["kind"])
        if std:
            run["profile"] = {m: delta(profiles[m], s.get_json("/profile")) for m, s in std.items()}
        print(
            f"{system:20} {w.name:10} N={n:<3} {run['output_throughput']:8.1f} tok/s "
            f"large {100 * run['large_share']:5.1f}%  wall {wall:6.1f} s",
            flush=True,
        )
        return run

    @staticmethod
    async def load(
        target: Target, jobs: list[list[int]], n: int, label: str
    ) -> tuple[list[Record], float]:
        """Every prompt at `n` in flight (closed loop); a failed request fails the run."""
        convs = [Conversation((ids,)) for ids in jobs]
        records, wall = await run_load(target, convs, max_concurrency=n, label=label)
        if bad := next((r for r in records if not r.ok), None):
            raise RuntimeError(f"{label}: a request failed: {bad.error}")
        return records, wall

    def _record(self, r: Record, reference: bool) -> dict[str, Any]:
        prompt, ids, models = r.prompt_ids or [], r.token_ids or [], r.models or []
        if reference:
            self.reference.add(prompt, ids, models)
            return r.to_dict()
        return {**r.to_dict(), "diverges_at": self.reference.divergence(prompt, ids, models)}

    # -- systems ---------------------------------------------------------------------
    async def run_all(self) -> dict[str, Any]:
        started = time.perf_counter()
        self.calibrate()
        await self.run_official()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            await self.run_tokenrouterd(session)
            if self.plan.ablation_daemons:
                for name, switch in ABLATIONS.items():
                    await self.run_ablation(session, name, switch)
            for system in self.plan.std_systems:
                await self.run_std(session, system, STD[system])
        table = self.reference.table()
        return {
            "pair": self.pair.describe(), "dtype": DTYPE,
            "threads": THREADS, "bound": self.bound, "plan": asdict(self.plan),
            "total_s": time.perf_counter() - started, "thresholds": self.thresholds,
            "step_costs": self.costs,
            "recommendation": self.recommendation, "runs": self.runs, "reference": table,
            "identity": identity(self.runs, table), "notes": self.notes,
        }  # fmt: skip

    def calibrate(self) -> None:
        """Each model's step costs, alone, before anything else runs (`stepcost.py`), at
        the short workload's mean context halfway through its output."""
        w = self.workload("short")
        prompts = self.prompts(w, self.plan.requests(self.top_n))
        context = round(sum(map(len, prompts)) / len(prompts) + w.max_tokens / 2)
        linear = cpu_linear(self.models.values())
        for name, path in self.models.items():
            self.costs[name] = calibrate(path, DTYPE, context, **ENGINE, cpu_linear=linear)
            c = self.costs[name]
            steps = ", ".join(f"b={b} {ms:.1f}" for b, ms in c["decode_ms"])
            prefill = "{} tokens {:.1f}".format(*c["prefill_ms"])
            print(f"step cost {name}: {steps}, prefill {prefill} ms (context {context})",
                  flush=True)  # fmt: skip

    async def run_official(self) -> None:
        loop = OfficialLoop(self.models, rstitch(self.tau))
        self.systems["official"] = loop.config()

        def make(max_tokens: int) -> Target:
            loop.max_tokens = max_tokens
            return loop

        # One request at a time whatever N is: it runs at N=1, on every prompt.
        for w, count in self.reference_jobs():
            await self.measure("official", make, w, 1, count, reference=True)

    def _daemon(self, name: str, engine: dict[str, Any]) -> Daemon:
        cfg = daemon_config(self.models, self.tau, engine, self.kv_tokens, self.context)
        if self.thresholds and name != "tokenrouterd":
            cfg["batching"] = {"thresholds": self.thresholds}
        self.systems[name] = cfg
        return serve_config(name, cfg, self.logs)

    async def _warmup(self, make: Make) -> None:
        await self.load(make(16), self.prompts(self.workload("short"), 2), 2, "warmup")

    async def _top_short(self, name: str, make: Make, d: Daemon) -> None:
        n, w = self.top_n, self.workload("short")
        await self.measure(name, make, w, n, self.plan.requests(n), daemon=d,
                           repeats=self.plan.repeats)  # fmt: skip

    async def run_tokenrouterd(self, session: aiohttp.ClientSession) -> None:
        d = self._daemon("tokenrouterd", {})

        def send(max_tokens: int) -> Target:
            return daemon_target(session, d.url, max_tokens)

        try:
            await self._warmup(send)
            # Thresholds all 1 first: that is the no-delayed-batching ablation, and it
            # gives the live figures the Markov model recommends thresholds from.
            await self._top_short("no_delayed_batching", send, d)
            self.recommend(d)
            w = self.workload("short")
            for n in self.plan.ns:
                repeats = self.plan.repeats if n == self.top_n else 1
                await self.measure("tokenrouterd", send, w, n, self.plan.requests(n), daemon=d,
                                   repeats=repeats)  # fmt: skip
            for length in self.plan.lengths:
                w = self.workload("long", length)
                await self.measure("tokenrouterd", send, w, self.top_n, self.top_n, daemon=d)
            if "agent" in self.pair.workloads and self.plan.agent_requests:
                w, count = self.workload("agent"), self.plan.agent_requests
                await self.measure("tokenrouterd", send, w, self.top_n, count, daemon=d)
            if self.plan.forced_delay:
                # Delayed batching forced on, whatever the model says: does waiting pay?
                d.admin_call("POST", "/thresholds", {"thresholds": {"large": FORCED_DELAY}})
                await self._top_short("forced_delay", send, d)
        finally:
            d.stop()

    def recommend(self, d: Daemon) -> None:
        """Apply the Markov model's thresholds from the live figures (the runs so far)."""
        try:
            rec = d.admin_call("GET", "/thresholds/recommend")
            self.thresholds, self.recommendation = rec["models"], rec
            d.admin_call("POST", "/thresholds", {"thresholds": self.thresholds})
        except AdminError as exc:
            self.notes.append(f"no threshold recommendation ({exc}); thresholds stay at 1")
        if self.thresholds and all(b == 1 for t in self.thresholds.values() for b in t):
            self.notes.append(
                "The Markov model recommended every threshold at 1 from the live figures, "
                "so no_delayed_batching ran the full system's configuration: their gap is "
                "run-to-run noise."
            )

    async def run_ablation(
        self, session: aiohttp.ClientSession, name: str, switch: dict[str, Any]
    ) -> None:
        try:
            d = self._daemon(name, switch)
        except RuntimeError as exc:
            self.notes.append(f"{name}: daemon did not start: {str(exc)[-300:]}")
            return
        try:

            def send(max_tokens: int) -> Target:
                return daemon_target(session, d.url, max_tokens)

            await self._warmup(send)
            await self._top_short(name, send, d)
        finally:
            d.stop()

    async def run_std(
        self, session: aiohttp.ClientSession, system: str, prefix_cache: bool
    ) -> None:
        servers = start_std_servers(system, self.models, self.logs, prefix_cache, self.kv_tokens)
        self.systems[system] = std_config(self.models, self.tau, prefix_cache, self.kv_tokens)
        try:
            urls = [servers[m].url for m in self.names]

            def send(max_tokens: int) -> Target:
                return Dispatcher(session, urls, self.names, self.tau, max_tokens)

            await self._warmup(send)
            w = self.workload("short")
            for n in self.plan.ns:
                count = self.plan.requests(n)
                await self.measure(system, send, w, n, count, std=servers)
            if self.plan.std_length:
                w = self.workload("long", self.plan.std_length)
                await self.measure(system, send, w, self.top_n, self.top_n, std=servers)
        finally:
            for s in servers.values():
                s.stop()
