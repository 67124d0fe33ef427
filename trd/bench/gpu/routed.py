"""The routed stages: one tokenrouterd daemon each (CUDA graphs on, MPS on or off, one
large share), measured through the one load client at every N of the plan.

    python -m trd.bench.gpu.stage routed-NAME CTX OUT.json NAME MPS SHARE FIRST PAIR

Started through the one launcher (trd/bench/server.py) with the pair in bfloat16, the
ensemble policy at the share (workload.py) and `mps: required` or `off`; token-id prompts
to /v1/completions, greedy, EOS ignored. Every run is checked against the designed tokens
and gets the forward-only ceiling and the batching bound from the engines' counters
(trd/bench/compare/ceiling.py, stepcost.py), the HBM bound of the steps they ran and the
throughput the step costs predict (bounds.py). The first daemon also serves the large
model alone (each request's `routing.model: large`: the small engine stays idle) at every
N, and the plan's long outputs.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from trd.bench.compare.ceiling import bound_kind, ceiling
from trd.bench.compare.runner import Bench
from trd.bench.compare.stepcost import batching_bound
from trd.bench.compare.systems import daemon_target
from trd.bench.gpu.bounds import model_bytes
from trd.bench.gpu.measure import add_hbm, add_prediction, counted_work, make_run
from trd.bench.gpu.plan import Ctx
from trd.bench.gpu.workload import Designed, prompts, routing
from trd.bench.server import Daemon, daemon_config, serve_config
from trd.bench.stages import Partial, log
from trd.mps.driver import find_control, path_with

START_TIMEOUT_S = 300.0  # two engines: the 8B's 16 GB loaded, kernels loaded, graphs captured
WARMUP_TOKENS = 16


def config(ctx: Ctx, models: dict[str, Path], mps: bool, share: float) -> dict[str, Any]:
    plan = ctx.plan
    longest = max(plan.max_tokens, plan.long_tokens)
    kv = max(max(plan.ns) * (plan.prompt_tokens + plan.max_tokens),
             max(plan.long_ns) * (plan.prompt_tokens + plan.long_tokens))  # fmt: skip
    policy = routing(share, plan.seed)
    return daemon_config(
        models, {"name": policy.name, **policy.params}, dtype=plan.dtype, kv_tokens=kv + 1024,
        max_model_len=plan.prompt_tokens + longest + 16, device=plan.device,
        mps="required" if mps else "off",
    )  # fmt: skip


def mps_env() -> dict[str, str]:
    """Where the daemon runs the MPS control daemon (a short path: a socket lives there),
    with the control binary on PATH; RuntimeError when the machine has none."""
    control = find_control()
    if control is None:
        raise RuntimeError("no nvidia-cuda-mps-control binary: MPS cannot run here")
    runtime = tempfile.mkdtemp(prefix="trdb-", dir="/tmp")
    return {"RUNTIME_DIRECTORY": runtime, "PATH": path_with(control)}


class Routed:
    def __init__(self, ctx: Ctx, out: Partial, name: str, share: float, extra: bool) -> None:
        self.ctx, self.out, self.name, self.share = ctx, out, name, share
        self.extra = extra  # the demo pair's shapes: no step costs measured for them
        self.models = ctx.pair_paths(extra)
        plan = ctx.plan
        count = max(plan.requests(max(plan.ns)), plan.requests(max(plan.long_ns)))
        self.prompts = prompts(self.models["small"], count, plan.prompt_tokens)
        self.sizes = {m: model_bytes(p, plan.dtype) for m, p in self.models.items()}
        self.bound = bound_kind(plan.device, os.cpu_count() or 1, 2, 1)

    async def measure(
        self, d: Daemon, session: aiohttp.ClientSession, n: int, max_tokens: int,
        share: float | None,
    ) -> None:  # fmt: skip
        jobs = self.prompts[: self.ctx.plan.requests(n)]
        system = self.name if share is not None else "large_alone"
        system += "_demo_shapes" if self.extra else ""
        body = None if share is not None else {"routing": {"model": "large"}}
        target = daemon_target(session, d.url, max_tokens, body)
        before = d.fresh_stats(time.time())
        records, wall = await Bench.load(target, jobs, n, f"{system} N={n}")
        after = d.fresh_stats(time.time())
        run = make_run(self.ctx, system, share, n, max_tokens, records, wall,
                       Designed(jobs, max_tokens, share, self.ctx.plan.seed))  # fmt: skip
        run["ceiling"] = ceiling(before, after, records, wall, self.bound)
        costs = self.ctx.read("stepcost").get("models")
        if costs and not self.extra:
            run["batching"] = batching_bound(before, after, costs, wall, self.bound["kind"])
            add_prediction(self.ctx, run, share)
        add_hbm(self.ctx, run, counted_work(before, after), self.sizes)
        self.out.append("runs", run)
        log(f"{system} {run['workload']} N={n}: {run['output_throughput']:.1f} tok/s, large "
            f"{100 * (run['large_share'] or 0):.1f}%, TPOT p50 {run['tpot_ms']['p50']} ms, "
            f"identical {run['identity']['identical']}/{run['identity']['compared']}")  # fmt: skip

    async def run_all(self, d: Daemon, first: bool) -> None:
        plan = self.ctx.plan
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            warm = daemon_target(session, d.url, WARMUP_TOKENS)
            await Bench.load(warm, self.prompts[:2], 2, "warm-up")
            for n in plan.ns:
                await self.measure(d, session, n, plan.max_tokens, self.share)
            if not first:
                return
            for n in plan.ns:
                await self.measure(d, session, n, plan.max_tokens, None)
            for n in plan.long_ns:
                await self.measure(d, session, n, plan.long_tokens, self.share)


def stage(ctx: Ctx, out: Partial, args: list[str]) -> bool:
    name, mps, share, first, pair = args
    on, extra = mps == "mps", pair == "extra"
    routed = Routed(ctx, out, name, float(share), extra)
    cfg = config(ctx, routed.models, on, float(share))
    out.put("system", name + ("_demo_shapes" if extra else ""))
    out.put("config", cfg)
    env = mps_env() if on else None
    start = time.perf_counter()
    d = serve_config(f"{name}-{share}-{pair}", cfg, ctx.out / "logs", START_TIMEOUT_S, env)
    out.put("start_s", round(time.perf_counter() - start, 1))
    log(f"{name}: serving after {out.data['start_s']} s")
    try:
        asyncio.run(routed.run_all(d, first == "first"))
    finally:
        d.stop()
    return all(Designed.identical(r) for r in out.data.get("runs", []))
