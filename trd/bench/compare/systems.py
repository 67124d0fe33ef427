"""The systems a comparison runs: the settings they share, and how each is reached.

    official      the research-code loop in this process (`OfficialLoop`)
    tokenrouterd  our daemon (and its variants: one setting changed, a name of its own),
                  reached through the one load client (`daemon_target`)
    std           standard servers (one per model) routed by the dispatcher
                  (`trd/bench/std/dispatcher.py`)

Servers start through the one launcher (`trd/bench/server.py`), each on a port it binds
itself and reports; their logs go to the run folder. Servers that do not depend on each
other are spawned together and then awaited, so their model loads overlap.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp

from trd.bench import server
from trd.bench.client import Client, Settings
from trd.bench.load import TokenTarget
from trd.bench.server import Server, start_std_server
from trd.models.checkpoint import read_checkpoint
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.testing.reference import ReferenceRouter

DTYPE = "float32"  # every system serves both models in this dtype
THREADS = 1  # torch threads per engine (and per standard server)
CORES = os.cpu_count() or 1  # the host's: the threads of the agent bench's *_wide systems
# Float32 linears through oneDNN's packed kernels (`trd/models/packed.py`) for models of
# hidden size ONEDNN_MIN_HIDDEN and up: on this project's 2-core host a decode step of the
# Qwen2.5-Coder pair at 4-16 rows costs 2-2.5x less than through MKL, where 2 rows already
# cost twice one. oneDNN's call costs 25-50 us, more than a whole matmul of the fixtures'
# 64-wide layers (9 us through MKL), so they keep torch's. The standard servers get the
# same; the official loop is transformers' own (`trd/testing/reference.py`), as research
# code runs it.
ONEDNN_MIN_HIDDEN = 512
ENGINE: dict[str, Any] = {
    "threads": THREADS,
    "max_batch_tokens": 2048,
}  # every daemon engine's settings
MODEL = "small+large"  # the daemon's model id for the pair


def cpu_linear(models: Iterable[Path]) -> str:
    """The engines' float32 linears for these models (`engine.cpu_linear`)."""
    hidden = min(read_checkpoint(p).config.hidden_size for p in models)
    return "onednn" if hidden >= ONEDNN_MIN_HIDDEN else "torch"


def daemon_config(
    models: dict[str, Path],
    tau: float,
    engine: dict[str, Any],
    kv_tokens: int,
    context: int,
    dtype: str = DTYPE,
) -> dict[str, Any]:
    """A compared daemon: R-Stitch at `tau`, the shared engine settings, `engine` on top."""
    # The packed oneDNN linears are float32 only.
    linear = cpu_linear(models.values()) if dtype == "float32" else "torch"
    return server.daemon_config(
        models, {"name": "rstitch", "threshold": tau}, dtype=dtype, kv_tokens=kv_tokens,
        max_model_len=context, engine={**ENGINE, "cpu_linear": linear, **engine},
        # One step of the 1.5B in float32 on one thread (a 2,048-token prefill chunk) can
        # outlast the 120 s default, which then reads the engine as hung.
        stall_timeout_s=3600,
    )  # fmt: skip


def std_config(
    models: dict[str, Path], tau: float, prefix_cache: bool, kv_tokens: int,
    max_batch_tokens: int = ENGINE["max_batch_tokens"], threads: int = THREADS,
) -> dict[str, Any]:  # fmt: skip
    """What a standard-serving system is, for the result."""
    return {"kind": "standard serving", "models": {n: str(p) for n, p in models.items()},
            "dtype": DTYPE, "dispatcher": {"policy": "rstitch", "threshold": tau},
            "prefix_cache": prefix_cache, "kv_tokens": kv_tokens,
            "max_batch_tokens": max_batch_tokens, "threads": threads,
            "cpu_linear": cpu_linear(models.values())}  # fmt: skip


def start_std_servers(
    system: str,
    models: dict[str, Path],
    folder: Path,
    prefix_cache: bool,
    kv_tokens: int,
    max_batch_tokens: int = ENGINE["max_batch_tokens"],
    threads: int = THREADS,
) -> dict[str, Server]:
    """One standard server per model, spawned together, each awaited healthy. Their steps
    feed at most as many tokens as the daemon's (`max_batch_tokens`): until 2026-12-04 they
    ran the engine default, 1,024, against the daemon's 2,048, so a new turn waited behind
    half as long a prefill step there. `threads` above the host's cores / models share
    the cores uncoordinated, as two servers on one host do by default."""
    linear = cpu_linear(models.values())
    servers = {
        name: start_std_server(f"{system}_{name}", path, folder, prefix_cache=prefix_cache,
                               kv_tokens=kv_tokens, cpu_linear=linear,
                               max_batch_tokens=max_batch_tokens, threads=threads)
        for name, path in models.items()
    }  # fmt: skip
    try:
        for s in servers.values():
            s.up()
    except BaseException:
        for s in servers.values():
            s.stop()
        raise
    return servers


class OfficialLoop(TokenTarget):
    """`trd/testing/reference.py` with its KV caches, the research-code way: one request
    at a time (it blocks the event loop while it runs, so it runs at N=1)."""

    def __init__(
        self, models: dict[str, Path], policy: PolicySpec, max_tokens: int = 0,
        dtype: str = DTYPE, device: str = "cpu",
    ) -> None:  # fmt: skip
        super().__init__(list(models), max_tokens)
        self.models, self.policy, self.dtype = models, policy, dtype
        self.router = ReferenceRouter(list(models.values()), policy, dtype, device, kv_cache=True)

    def config(self) -> dict[str, Any]:
        return {"kind": "official loop", "models": {n: str(p) for n, p in self.models.items()},
                "dtype": self.dtype, "policy": {"name": self.policy.name, **self.policy.params},
                "kv_cache": True}  # fmt: skip

    async def generate(self, ids: list[int]) -> tuple[float, float, list[int], list[int]]:
        out = self.router.run(ids, SamplingParams(max_tokens=self.max_tokens, ignore_eos=True))
        return out.ttft, out.latency, out.tokens, out.models


def rstitch(tau: float) -> PolicySpec:
    return PolicySpec("rstitch", {"threshold": tau})


def daemon_target(
    session: aiohttp.ClientSession, url: str, max_tokens: int,
    extra_body: dict[str, Any] | None = None,
) -> Client:  # fmt: skip
    """The daemon through the load client: token-id prompts to /v1/completions, greedy,
    EOS ignored, the token ids and producers asked for and checked against the usage;
    `extra_body` in every request (e.g. its routing)."""
    settings = Settings(url, MODEL, "completions", max_tokens, ignore_eos=True,
                        extra_body=extra_body or {})  # fmt: skip
    return Client(session, settings)
