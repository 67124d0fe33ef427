"""The standard servers over HTTP: with the prefix cache they give the stateless tokens.

The R-Stitch dispatcher runs the same prompts against a pair of cached servers and a
pair of stateless ones (the real aiohttp apps on loopback ports, in this process so
that four servers start in a second; the bench smoke test runs them as processes);
token ids, the producing model of each token and the handoffs must agree, and each
server's /profile must account for the calls it served.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from trd.bench.compare.report import profile_table
from trd.bench.compare.workloads import Workload, prompts
from trd.bench.datasets import Conversation
from trd.bench.load import run_load
from trd.bench.record import Record
from trd.bench.std.dispatcher import Dispatcher
from trd.bench.std.engine import StdEngine
from trd.bench.std.phases import Profile, shares
from trd.bench.std.server import make_app
from trd.engines.spec import EngineSpec

TAU = 0.8
MAX_TOKENS = 24
MODELS = ("small", "large")


async def serve_and_dispatch(
    models: dict[str, Path], prefix_cache: bool, jobs: list[list[int]]
) -> tuple[list[Record], dict[str, Any]]:
    runners, urls = [], []
    for m in MODELS:
        spec = EngineSpec.of(models[m], prefix_cache=prefix_cache)
        engine = StdEngine(spec, profile=Profile())
        runner = web.AppRunner(make_app(engine))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()  # a port the OS picks
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
    try:
        async with aiohttp.ClientSession() as session:
            disp = Dispatcher(session, urls, list(MODELS), TAU, MAX_TOKENS)
            convs = [Conversation((ids,)) for ids in jobs]
            records, _ = await run_load(disp, convs, max_concurrency=len(jobs))
            profiles = {}
            for m, url in zip(MODELS, urls, strict=True):
                async with session.get(f"{url}/profile") as resp:
                    profiles[m] = await resp.json()
        return records, profiles
    finally:
        for runner in runners:
            await runner.cleanup()


def test_cached_servers_reproduce_stateless_tokens_and_profile_calls(
    tiny_models: dict[str, Path],
) -> None:
    # Prompts of 45 tokens: calls cross block boundaries (16) and hit full blocks.
    jobs = prompts(tiny_models["small"], Workload("t", 45, MAX_TOKENS, seed=4), 3)
    cached, prof_c = asyncio.run(serve_and_dispatch(tiny_models, True, jobs))
    plain, prof_p = asyncio.run(serve_and_dispatch(tiny_models, False, jobs))
    assert [r.token_ids for r in cached] == [r.token_ids for r in plain]
    assert all(len(r.token_ids or []) == MAX_TOKENS for r in cached)
    assert [r.models for r in cached] == [r.models for r in plain]
    assert [r.handoffs for r in cached] == [r.handoffs for r in plain]
    assert sum(r.handoffs or 0 for r in cached) > 0  # both servers served calls

    calls = [sum(p["calls"] for p in prof.values()) for prof in (prof_c, prof_p)]
    # The same calls in both: one per committed token plus one per token small dropped.
    assert calls[0] == calls[1] >= len(jobs) * MAX_TOKENS
    for prof, cache in ((prof_c, True), (prof_p, False)):
        for p in prof.values():
            assert p["prefix_cache"] is cache
            assert sum(p["shares"].values()) == pytest.approx(1.0)
            assert p["seconds"]["forward"] > 0 and p["seconds"]["http_json"] > 0
    assert all(p["seconds"]["match"] == 0 and p["cached_tokens"] == 0 for p in prof_p.values())
    small = prof_c["small"]
    assert small["cached_tokens"] > 0.7 * small["prompt_tokens"]
    assert small["seconds"]["match"] > 0 and small["seconds"]["insert"] > 0


def test_report_shows_the_profile_next_to_the_papers() -> None:
    seconds = {"http_json": 1.0, "admit": 1.0, "match": 3.0, "forward": 4.0,
               "insert": 0.5, "unlock": 0.5}  # fmt: skip
    prof = {"calls": 1000, "prompt_tokens": 10000, "cached_tokens": 9000,
            "seconds": seconds, "shares": shares(seconds)}  # fmt: skip
    profile = {"small": prof, "large": prof}
    run = {"system": "std", "workload": "long@512", "duration_s": 20.0, "profile": profile}
    lines = profile_table([run, {"system": "std", "workload": "short"}])
    assert lines[0] == "| phase | paper (SGLang, small model) | std small | std large |"
    assert "| match | 38.4% | 30.0% (3.00) | 30.0% (3.00) |" in lines
    assert "| forward | 4.2% | 40.0% (4.00) | 40.0% (4.00) |" in lines
    assert "| http_json | - | 10.0% (1.00) | 10.0% (1.00) |" in lines
    assert lines[-2] == "| prompt tokens served from the cache | - | 90% | 90% |"
    assert lines[-1] == "| time in the phases / run wall time | - | 50% | 50% |"
    assert profile_table([]) == ["(no standard-serving profile in this run)"]
