"""Start and stop the servers under test: tokenrouterd daemons and standard servers.

Each server is a subprocess on free loopback ports with its log in the run folder;
`up()` waits for its /health and fails with the log when it never comes up. Servers
that do not depend on each other are spawned together and then awaited, so their
model loads overlap.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trd.models.checkpoint import read_checkpoint

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0
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
ENGINE = {"threads": THREADS, "max_batch_tokens": 2048}  # every daemon engine's settings


def cpu_linear(models: Iterable[Path]) -> str:
    """The engines' float32 linears for these models (`engine.cpu_linear`)."""
    hidden = min(read_checkpoint(p).config.hidden_size for p in models)
    return "onednn" if hidden >= ONEDNN_MIN_HIDDEN else "torch"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def up(self) -> Server:
        """Wait until the server answers /health; stop it if it never does, or if the wait
        is cut short (an interrupt while a daemon loads must not leave it running)."""
        try:
            return self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _wait_healthy(self) -> Server:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if (code := self.proc.poll()) is not None:
                log = self.log.read_text()[-4000:]
                raise RuntimeError(f"{self.name} exited with code {code}:\n{log}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.name} not healthy in {START_TIMEOUT_S} s")

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as resp:
            return json.loads(resp.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def spawn(name: str, argv: list[str], folder: Path) -> Server:
    log = folder / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *argv], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            # The tree itself first: a checkout other than the installed one runs its own trd.
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "scripts")])},
        )  # fmt: skip
    return Server(name, proc, "", log)


@dataclass
class Daemon:
    server: Server
    admin: str  # admin API base URL

    def fresh_stats(self, since: float, timeout: float = 300.0) -> dict[str, dict[str, Any]]:
        """Every engine's raw stats, published after wall time `since` (engines publish
        every 0.5 s, and after a step that outlasts that): a snapshot that holds every step
        before `since`. One step can take a minute (a float32 1.5B prefill chunk on one
        thread, or prefills ahead of the warm-up's requests), hence the timeout."""
        deadline = time.monotonic() + timeout
        while True:
            stats: dict[str, dict[str, Any]] = self.admin_get("/stats/raw")
            if stats and all(body.get("time", 0.0) > since for body in stats.values()):
                return stats
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.server.name}: no engine stats newer than {since}")
            time.sleep(0.1)

    def admin_get(self, path: str) -> Any:
        with urllib.request.urlopen(self.admin + path, timeout=30) as resp:
            return json.loads(resp.read())

    def admin_post(self, path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(
            self.admin + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())


def daemon_config(
    models: dict[str, Path],
    tau: float,
    engine: dict[str, Any],
    kv_tokens: int,
    context: int,
    dtype: str = DTYPE,
) -> dict[str, Any]:
    # The packed oneDNN linears are float32 only.
    linear = cpu_linear(models.values()) if dtype == "float32" else "torch"
    return {
        "listen": f"127.0.0.1:{free_port()}",
        "admin": f"127.0.0.1:{free_port()}",
        "device": "cpu",
        "mps": "off",
        "memory": {"max_kv_tokens": kv_tokens},
        "max_model_len": context,
        "models": [{"name": n, "path": str(p), "dtype": dtype} for n, p in models.items()],
        "policy": {"name": "rstitch", "threshold": tau},
        "engine": {**ENGINE, "cpu_linear": linear, **engine},
        "shutdown": {"grace_s": 5},
        # One step of the 1.5B in float32 on one thread (a 2,048-token prefill chunk) can
        # outlast the 120 s default, which then reads the engine as hung.
        "stall_timeout_s": 3600,
    }


def start_daemon(name: str, cfg: dict[str, Any], folder: Path) -> Daemon:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    server = spawn(name, ["-m", "trd.daemon", "--config", str(path)], folder)
    server.url = f"http://{cfg['listen']}"
    return Daemon(server.up(), f"http://{cfg['admin']}")


def std_argv(
    path: Path,
    port: int,
    prefix_cache: bool,
    kv_tokens: int,
    linear: str,
    max_batch_tokens: int,
    threads: int = THREADS,
) -> list[str]:
    """A standard server's command line: the daemon's engine settings where both have one."""
    argv = [str(ROOT / "scripts/baselines/std_server.py"), "--model", str(path)]
    argv += ["--port", str(port), "--kv-tokens", str(kv_tokens), "--cpu-linear", linear]
    argv += ["--threads", str(threads), "--max-batch-tokens", str(max_batch_tokens)]
    return argv + ([] if prefix_cache else ["--no-prefix-cache"])


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
    servers: dict[str, Server] = {}
    linear = cpu_linear(models.values())
    for name, path in models.items():
        port = free_port()
        argv = std_argv(path, port, prefix_cache, kv_tokens, linear, max_batch_tokens, threads)
        servers[name] = spawn(f"{system}_{name}", argv, folder)
        servers[name].url = f"http://127.0.0.1:{port}"
    try:
        for server in servers.values():
            server.up()
    except RuntimeError:
        for server in servers.values():
            server.stop()
        raise
    return servers
