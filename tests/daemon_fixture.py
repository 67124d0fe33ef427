"""The real daemon as a subprocess for the e2e tests, through the one launcher
(`trd/bench/server.py`): it binds port 0 and reports the ports it got, so no two tests
race for a port.

Each test module starts one daemon (module-scoped fixture) and shares it; every wait is
bounded, and a daemon that fails to come up fails the test with its log.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from trd.bench import server
from trd.bench.server import daemon_config

REPO_ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 150.0
SCHEDULE = [0, 0, 1, 0, 1, 1]


def shm_segments(pid: int) -> list[str]:
    """The shared-memory segments a daemon with this pid created and left."""
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"trd-{pid}-")]


def write_config(
    tmp: Path, models: dict[str, Path], names: list[str], dtype: str = "float32", **extra: Any
) -> Path:
    """The tests' daemon: CPU, port 0, admin on a unix socket, and a scripted policy by
    which every model produces tokens and hands off, whatever the fixture weights are."""
    policy = {"name": "scripted", "schedule": SCHEDULE if len(names) > 1 else [0]}
    cfg = daemon_config(
        {n: models[n] for n in names}, policy, dtype=dtype, kv_tokens=8192, max_model_len=512,
        engine={"threads": 1, "max_batch_tokens": 512}, admin=f"unix:{tmp / 'admin.sock'}",
    )  # fmt: skip
    return server.write_config({**cfg, **extra}, tmp / "config.yaml")


@dataclass
class Daemon(server.Daemon):
    def status(self) -> dict[str, Any]:
        """`GET /status` of the admin API, with the config's admin token."""
        return dict(self.admin_call("GET", "/status"))

    def client(self, timeout: float = 60.0) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=timeout
        )


def launch_daemon(
    config_path: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
) -> Daemon:
    """Start the daemon process (`args`: more flags) without waiting for it to serve."""
    d = server.launch_daemon(config_path, env, args)
    return Daemon(**{k: getattr(d, k) for k in d.__dataclass_fields__})


def wait_serving(daemon: Daemon, timeout: float = START_TIMEOUT_S) -> Daemon:
    daemon.up(timeout)
    return daemon


def start_daemon(config_path: Path, env: dict[str, str] | None = None) -> Daemon:
    return wait_serving(launch_daemon(config_path, env))
