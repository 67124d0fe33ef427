"""Smoke runs of the benchmark pieces at a tiny size: they run, and they agree.

The load client against a real daemon, the research-code baseline and the standard-
serving dispatcher producing the daemon's exact greedy outputs, and the report
generator on a synthetic result. Sizes are tiny: this checks the scripts, it times
nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from bench_report import render
from tokenizers import Tokenizer

from trd.protocol import SamplingParams

from baselines.dispatcher import Dispatcher
from baselines.official import OfficialRouter
from benchkit.client import OpenAIClient, Record, closed_loop
from benchkit.summary import summarize
from benchkit.systems import start_std_server
from benchkit.workloads import Workload, prompts
from daemon_fixture import Daemon, start_daemon, write_config

TAU = 0.8
MAX_TOKENS = 12
WORKLOAD = Workload("tiny", prompt_tokens=20, max_tokens=MAX_TOKENS, seed=1)


@pytest.fixture(scope="module")
def daemon(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("bench")
    policy = {"name": "rstitch", "threshold": TAU}
    d = start_daemon(write_config(tmp, tiny_models, ["small", "large"], policy=policy))
    yield d
    d.stop()


@pytest.fixture(scope="module")
def jobs(tiny_models: dict[str, Path]) -> list[list[int]]:
    return prompts(tiny_models["small"], WORKLOAD, 3)


async def daemon_records(
    daemon: Daemon, jobs: list[list[int]], n: int
) -> tuple[list[Record], float]:
    async with aiohttp.ClientSession() as session:
        client = OpenAIClient(session, daemon.url, daemon.model)
        return await closed_loop(client.send, jobs, MAX_TOKENS, n)


def test_load_client_records_every_request(daemon: Daemon, jobs: list[list[int]]) -> None:
    records, wall = asyncio.run(daemon_records(daemon, jobs, n=2))
    assert len(records) == len(jobs)
    for r in records:
        assert r.output_tokens == MAX_TOKENS  # EOS ignored: every request runs to max
        assert sum(r.tokens_per_model.values()) == MAX_TOKENS
        assert 0 < r.ttft <= r.latency and r.text
    s = summarize(records, wall)
    assert s["output_tokens"] == len(jobs) * MAX_TOKENS
    assert s["throughput"] == pytest.approx(s["output_tokens"] / wall)
    assert s["ttft_p50"] <= s["ttft_p99"] and 0 <= s["large_fraction"] <= 1


def test_baselines_reproduce_the_daemons_outputs(
    daemon: Daemon, jobs: list[list[int]], tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    served, _ = asyncio.run(daemon_records(daemon, jobs[:2], n=2))
    tok = Tokenizer.from_file(str(tiny_models["small"] / "tokenizer.json"))
    official = OfficialRouter(
        [tiny_models["small"], tiny_models["large"]], "rstitch", {"threshold": TAU}
    )
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = [official.generate(p, params) for p in jobs[:2]]
    assert [tok.decode(o.tokens) for o in outs] == [r.text for r in served]
    assert [o.models.count(1) for o in outs] == [r.tokens_per_model["large"] for r in served]

    servers = [start_std_server(f"std_{m}", tiny_models[m], tmp_path) for m in ("small", "large")]
    try:

        async def dispatch() -> list[Record]:
            async with aiohttp.ClientSession() as session:
                disp = Dispatcher(session, [s.url for s in servers], ["small", "large"], TAU, tok)
                return (await closed_loop(disp.send, jobs[:2], MAX_TOKENS, 2))[0]

        std = asyncio.run(dispatch())
    finally:
        for s in servers:
            s.stop()
    assert [r.text for r in std] == [r.text for r in served]
    assert [r.tokens_per_model for r in std] == [r.tokens_per_model for r in served]


def synthetic_run(system: str, workload: str, n: int, tok_s: float, **extra: Any) -> dict[str, Any]:
    stats = {f"{k}_p{q}": 0.01 for k in ("ttft", "tpot", "latency") for q in (50, 90, 99)}
    return {
        "system": system, "workload": workload, "prompt_tokens": 100, "max_tokens": 256,
        "n": n, "requests": 4, "throughput": tok_s, "large_fraction": 0.3,
        "handoffs_per_request": 5.0, **stats, **extra,
    }  # fmt: skip


def test_report_renders_targets_tables_and_plots(tmp_path: Path) -> None:
    ceiling = {"ceiling_throughput": 1000.0, "models": {
        "small": {"batch_size_mean": 8.0, "step_ms_mean": 2.0},
        "large": {"batch_size_mean": 4.0, "step_ms_mean": 3.0}}}  # fmt: skip
    runs = [
        synthetic_run("official", "short", 1, 50.0),
        synthetic_run("tokenrouterd", "short", 1, 100.0),
        synthetic_run("tokenrouterd", "short", 16, 800.0, ceiling=ceiling),
        synthetic_run("tokenrouterd", "long@256", 16, 800.0),
        {**synthetic_run("tokenrouterd", "long@2048", 16, 760.0), "max_tokens": 2048},
        synthetic_run("std", "short", 16, 200.0),
        synthetic_run("std", "long@256", 16, 100.0),
        synthetic_run("no_delayed_batching", "short", 16, 600.0),
        synthetic_run("no_pending_kv", "short", 16, 900.0),
    ]
    data = {
        "machine": {"cores": 2, "cpu": "x86_64", "python": "3.11", "torch": "2", "date": "now"},
        "total_s": 60.0, "command": "bench.py", "tau": TAU, "thresholds": {}, "runs": runs,
        "identity": [{"system": "std", "workload": "short", "compared": 4, "identical": 3}],
        "notes": [],
    }  # fmt: skip
    md = render(data, tmp_path / "benchmarks.md")
    assert "| tokenrouterd / official, N=16 | >= 10x | 16.00x | yes |" in md
    assert "| tokenrouterd / std, 256 output tokens, N=16 | >= 5x | 8.00x | yes |" in md
    assert "| throughput at 2048 / at 256 output tokens | >= 90% | 95% | yes |" in md
    assert "| no_pending_kv / tokenrouterd, N=16 | < 1.00x | 1.12x | NO |" in md
    assert "| step_sync / tokenrouterd, N=16 | < 1.00x | not run | NO |" in md
    assert "| tokenrouterd / forward-only ceiling, N=16 | >= 70% | 80% | yes |" in md
    assert "| all | 3/4 | NO |" in md
    for png in (
        "bench_throughput_vs_n.png",
        "bench_throughput_vs_length.png",
        "bench_ablations.png",
    ):
        assert (tmp_path / png).stat().st_size > 1000
