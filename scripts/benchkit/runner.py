"""Runs every system on every workload of a plan and collects the results.

    official -> tokenrouterd (thresholds all 1, then the Markov recommendation)
             -> ablation daemons -> standard serving (std: prefix cache, std_nocache: none)
    each run: closed loop at N, records, summary; for daemons the forward ceiling, for
    standard servers the per-phase profile of each server (`baselines/phases.py`)

Outputs of every system are checked against tokenrouterd's on the same prompts.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import torch
from tokenizers import Tokenizer

from trd.protocol import SamplingParams

from baselines.dispatcher import Dispatcher
from baselines.official import OfficialRouter
from baselines.phases import delta
from benchkit.client import OpenAIClient, Record, Send, closed_loop
from benchkit.plan import Plan
from benchkit.summary import ceiling, summarize
from benchkit.systems import Daemon, Server, daemon_config, start_daemon, start_std_server
from benchkit.workloads import WORKLOADS, Workload, prompts

MODEL = "small+large"
FORCED_DELAY = [1, 1, 1, 2, 2, 2, 2, 4]  # the large model's B by active requests (8+: 4)
STD = {"std": True, "std_nocache": False}  # standard-serving systems: prefix cache on?
ABLATIONS = {"no_pending_kv": {"pending_kv": False}, "step_sync": {"step_sync": True}}


def machine() -> dict[str, Any]:
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


class Bench:
    def __init__(self, plan: Plan, models: dict[str, Path], tau: float, logs: Path) -> None:
        self.plan, self.models, self.tau, self.logs = plan, models, tau, logs
        self.tokenizer = Tokenizer.from_file(str(models["small"] / "tokenizer.json"))
        self.runs: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self.thresholds: dict[str, list[int]] = {}
        self.recommendation: dict[str, Any] = {}  # the Markov model's full answer

    # -- workloads -------------------------------------------------------------------
    def workload(self, name: str, max_tokens: int | None = None) -> Workload:
        w = WORKLOADS[name]
        w = Workload(
            w.name, self.plan.tokens(w.prompt_tokens), self.plan.tokens(w.max_tokens), w.seed
        )
        return w if max_tokens is None else w.with_max_tokens(max_tokens)

    def prompts(self, w: Workload, count: int) -> list[list[int]]:
        return prompts(self.models["small"], w, count)

    @property
    def top_n(self) -> int:
        return max(self.plan.ns)

    # -- one run ---------------------------------------------------------------------
    async def measure(
        self,
        system: str,
        send: Send,
        w: Workload,
        n: int,
        count: int,
        daemon: Daemon | None,
        repeats: int = 1,
        std: dict[str, Server] | None = None,
    ) -> dict[str, Any]:
        """Run `repeats` times and keep the fastest: the host is shared, noise only slows."""
        runs = [
            await self._measure_once(system, send, w, n, count, daemon, std) for _ in range(repeats)
        ]
        best = max(runs, key=lambda r: r["throughput"])
        best["throughputs"] = [r["throughput"] for r in runs]
        self.runs.append(best)
        return best

    async def _measure_once(
        self,
        system: str,
        send: Send,
        w: Workload,
        n: int,
        count: int,
        daemon: Daemon | None,
        std: dict[str, Server] | None,
    ) -> dict[str, Any]:
        """One closed-loop run; daemons add the forward ceiling, std servers their profile."""
        jobs = self.prompts(w, count)
        before = daemon.admin_get("/stats/raw") if daemon else None
        profiles = {m: s.get("/profile") for m, s in (std or {}).items()}
        records, wall = await closed_loop(send, jobs, w.max_tokens, n, f"{system} {w.name} N={n}")
        run = {
            "system": system, "workload": w.name, "prompt_tokens": w.prompt_tokens,
            "max_tokens": w.max_tokens, "n": n, **summarize(records, wall),
            "records": [{**r.to_dict(), "text": digest(r.text)} for r in records],
        }  # fmt: skip
        if daemon and before is not None:
            await asyncio.sleep(1.2)  # engines publish Stats every 0.5 s
            run["ceiling"] = ceiling(before, daemon.admin_get("/stats/raw"), records)
        if std:
            run["profile"] = {m: delta(profiles[m], s.get("/profile")) for m, s in std.items()}
        print(
            f"{system:20} {w.name:10} N={n:<3} {run['throughput']:8.1f} tok/s "
            f"large {100 * run['large_fraction']:5.1f}%  wall {wall:6.1f} s",
            flush=True,
        )
        return run

    # -- systems ---------------------------------------------------------------------
    async def run_all(self) -> dict[str, Any]:
        started = time.perf_counter()
        await self.run_official()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            await self.run_tokenrouterd(session)
            for name, switch in ABLATIONS.items():
                await self.run_ablation(session, name, switch)
            for system, prefix_cache in STD.items():
                await self.run_std(session, system, prefix_cache)
        return {
            "machine": machine(),
            "total_s": time.perf_counter() - started,
            "thresholds": self.thresholds,
            "recommendation": self.recommendation,
            "runs": self.runs,
            "identity": self.identity(),
            "notes": self.notes,
        }

    async def run_official(self) -> None:
        router = OfficialRouter(
            [self.models["small"], self.models["large"]], "rstitch", {"threshold": self.tau}
        )

        async def send(prompt: list[int], max_tokens: int) -> Record:
            out = router.generate(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            return Record(
                out.ttft, out.latency, len(out.tokens),
                {"small": out.models.count(0), "large": out.models.count(1)},
                sum(a != b for a, b in itertools.pairwise(out.models)),
                self.tokenizer.decode(out.tokens, skip_special_tokens=True),
            )  # fmt: skip

        # One request at a time whatever N is: its throughput does not depend on N.
        w, count = self.workload("short"), self.plan.official_requests
        await self.measure("official", send, w, 1, count, None, self.plan.repeats)

    async def _daemon_runs(self, session: aiohttp.ClientSession, name: str, d: Daemon) -> None:
        send = OpenAIClient(session, d.server.url, MODEL).send
        n = self.top_n
        w, count = self.workload("short"), self.plan.requests(n)
        await self.measure(name, send, w, n, count, d, self.plan.repeats)

    async def run_tokenrouterd(self, session: aiohttp.ClientSession) -> None:
        cfg = daemon_config(self.models, self.tau, {})
        d = start_daemon("tokenrouterd", cfg, self.logs)
        send = OpenAIClient(session, d.server.url, MODEL).send
        try:
            await closed_loop(send, self.prompts(self.workload("short"), 2), 16, 2, "warmup")
            # Thresholds all 1 first: that is the no-delayed-batching ablation, and it
            # gives the live figures the Markov model recommends thresholds from.
            await self._daemon_runs(session, "no_delayed_batching", d)
            await asyncio.sleep(1.2)
            try:
                rec = d.admin_get("/thresholds/recommend")
                self.thresholds, self.recommendation = rec["models"], rec
                d.admin_post("/thresholds", {"thresholds": self.thresholds})
            except OSError as exc:
                self.notes.append(f"no threshold recommendation ({exc}); thresholds stay at 1")
            if self.thresholds and all(b == 1 for t in self.thresholds.values() for b in t):
                self.notes.append(
                    "The Markov model recommended every threshold at 1 from the live figures, "
                    "so no_delayed_batching ran the full system's configuration: their gap is "
                    "run-to-run noise."
                )
            w = self.workload("short")
            for n in self.plan.ns:
                repeats = self.plan.repeats if n == self.top_n else 1
                await self.measure("tokenrouterd", send, w, n, self.plan.requests(n), d, repeats)
            for length in self.plan.lengths:
                w = self.workload("long", length)
                await self.measure("tokenrouterd", send, w, self.top_n, self.top_n, d)
            agent = self.workload("agent")
            await self.measure("tokenrouterd", send, agent, self.top_n, self.plan.agent_requests, d)
            # Delayed batching forced on, whatever the model says: does waiting pay here?
            d.admin_post("/thresholds", {"thresholds": {"large": FORCED_DELAY}})
            await self._daemon_runs(session, "forced_delay", d)
        finally:
            d.server.stop()

    async def run_ablation(
        self, session: aiohttp.ClientSession, name: str, switch: dict[str, Any]
    ) -> None:
        cfg = daemon_config(self.models, self.tau, switch)
        if self.thresholds:
            cfg["batching"] = {"thresholds": self.thresholds}
        try:
            d = start_daemon(name, cfg, self.logs)
        except RuntimeError as exc:
            self.notes.append(f"{name}: daemon did not start: {str(exc)[-300:]}")
            return
        try:
            send = OpenAIClient(session, d.server.url, MODEL).send
            await closed_loop(send, self.prompts(self.workload("short"), 2), 16, 2, "warmup")
            await self._daemon_runs(session, name, d)
        finally:
            d.server.stop()

    async def run_std(
        self, session: aiohttp.ClientSession, system: str, prefix_cache: bool
    ) -> None:
        servers = {
            m: start_std_server(f"{system}_{m}", self.models[m], self.logs, prefix_cache)
            for m in ("small", "large")
        }
        try:
            urls = [s.url for s in servers.values()]
            disp = Dispatcher(session, urls, list(servers), self.tau, self.tokenizer)
            await closed_loop(disp.send, self.prompts(self.workload("short"), 2), 16, 2, "warmup")
            w = self.workload("short")
            for n in self.plan.ns:
                count = self.plan.requests(n)
                await self.measure(system, disp.send, w, n, count, None, std=servers)
            w = self.workload("long", self.plan.std_length)
            await self.measure(system, disp.send, w, self.top_n, self.top_n, None, std=servers)
        finally:
            for s in servers.values():
                s.stop()

    # -- checks ----------------------------------------------------------------------
    def identity(self) -> list[dict[str, Any]]:
        """Per system and workload: prompts compared with tokenrouterd, and how many match."""
        ref: dict[tuple[str, int], Sequence[str]] = {}
        for run in self.runs:
            if run["system"] == "tokenrouterd":
                ref.setdefault(
                    (run["workload"], run["max_tokens"]), [r["text"] for r in run["records"]]
                )
        out = []
        for run in self.runs:
            base = ref.get((run["workload"], run["max_tokens"]))
            if run["system"] == "tokenrouterd" or base is None:
                continue
            texts = [r["text"] for r in run["records"]]
            pairs = list(zip(texts, base, strict=False))
            out.append({
                "system": run["system"], "workload": run["workload"], "n": run["n"],
                "compared": len(pairs), "identical": sum(a == b for a, b in pairs),
            })  # fmt: skip
        return out
