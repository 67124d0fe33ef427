"""Start the real daemon as a subprocess on a free loopback port, for the e2e tests.

Each test module starts one daemon (module-scoped fixture) and shares it; every wait is
bounded, and a daemon that fails to come up fails the test with its log.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 150.0
SCHEDULE = [0, 0, 1, 0, 1, 1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shm_segments(pid: int) -> list[str]:
    """The shared-memory segments a daemon with this pid created and left."""
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"trd-{pid}-")]


def write_config(
    tmp: Path, models: dict[str, Path], names: list[str], dtype: str = "float32", **extra: Any
) -> Path:
    cfg = {
        "listen": f"127.0.0.1:{free_port()}",
        "admin": f"unix:{tmp / 'admin.sock'}",
        "device": "cpu",
        "mps": "off",
        "memory": {"max_kv_tokens": 8192},
        "max_model_len": 512,
        "models": [{"name": n, "path": str(models[n]), "dtype": dtype} for n in names],
        # Every model produces tokens and hands off, whatever the fixture weights are.
        "policy": {"name": "scripted", "schedule": SCHEDULE if len(names) > 1 else [0]},
        "engine": {"threads": 1, "max_batch_tokens": 512},
        "shutdown": {"grace_s": 5},
        **extra,
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    config: dict[str, Any]
    log_path: Path
    config_path: Path
    cafile: Path | None = None  # with ssl_certfile: the CA the test clients trust

    @property
    def scheme(self) -> str:
        return "https" if "ssl_certfile" in self.config else "http"

    @property
    def port(self) -> int:
        return int(self.config["listen"].rpartition(":")[2])

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def admin(self) -> str:
        return str(self.config["admin"])

    def status(self) -> dict[str, Any]:
        """`GET /status` of the admin API, with the config's admin token."""
        from trd.cli import request

        return request(self.admin, "GET", "/status", token=self.config.get("admin_token", ""))

    @property
    def model(self) -> str:
        return "+".join(m["name"] for m in self.config["models"])

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, timeout: float = 60.0) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=timeout
        )

    def get(self, path: str) -> tuple[int, Any]:
        try:
            tls = None if self.cafile is None else ssl.create_default_context(cafile=self.cafile)
            with urllib.request.urlopen(self.url + path, timeout=10, context=tls) as resp:
                body = resp.read()
                status = resp.status
        except urllib.error.HTTPError as exc:
            body, status = exc.read(), exc.code
        ctype = "json" if body[:1] in (b"{", b"[") else "text"
        return status, json.loads(body) if ctype == "json" else body.decode()

    def wait_status(self, path: str, want: int, timeout: float, every: float = 0.2) -> Any:
        """Poll GET `path` until it answers `want`; returns that answer's body."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.log()}")
            try:
                status, body = self.get(path)
                if status == want:
                    return body
            except OSError:
                pass
            time.sleep(every)
        raise AssertionError(f"{path} never returned {want} in {timeout} s:\n{self.log()}")

    def wait_ready(self, timeout: float) -> None:
        """Until /ready says every engine serves (the HTTP port opens only after the first
        start, so this also waits for the daemon to come up)."""
        self.wait_status("/ready", 200, timeout)

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"daemon ignored SIGTERM for {timeout} s:\n{self.log()}") from None


def launch_daemon(
    config_path: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
) -> Daemon:
    """Start the daemon process (`args`: more flags) without waiting for it to serve."""
    log_path = config_path.parent / "daemon.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trd.daemon", "--config", str(config_path), *args],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
    return Daemon(proc, yaml.safe_load(config_path.read_text()), log_path, config_path)


def wait_serving(daemon: Daemon, timeout: float = START_TIMEOUT_S) -> Daemon:
    try:
        daemon.wait_ready(timeout)
    except BaseException:
        daemon.stop()
        raise
    return daemon


def start_daemon(config_path: Path, env: dict[str, str] | None = None) -> Daemon:
    return wait_serving(launch_daemon(config_path, env))
