"""The one launcher: every process a benchmark or a test serves from, started and stopped.

    launch(name, argv, folder)     a process, its log in folder/NAME.log; it is given
                                   `--ready-file folder/NAME.ready.json` and writes there
                                   the addresses it bound once it serves
    Server.up(timeout)             until it said where it listens and its health check
                                   answers 200; stopped if it dies or the wait is cut short
    Server.stop()                  SIGTERM, then SIGKILL after the timeout

    daemon_config(models, policy)  the one config builder of our daemon (a dict the daemon
                                   validates); listen and admin on port 0
    launch_daemon / start_daemon   `tokenrouterd --config` (`Daemon`: admin calls, stats);
    serve_config                   the same from a config dict
    start_std_server               a standard server of one model (`trd/bench/std/server.py`)
    launch_engine_host             `tokenrouterd engine` (a model for a daemon elsewhere)

No port is ever found free by binding it and releasing it for the process to take (a
race with every other process of the machine): each process binds port 0 and reports
the port it got, in its ready file or, for a server that cannot write one
(llama-server), a log line (`ready_line`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]  # the folder holding this trd package
START_TIMEOUT_S = 180.0


class NotServing(OSError):
    """The process has not said where it listens (yet)."""


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    ready_file: Path | None = None  # where it writes {"listen": "host:port", ...}
    ready_line: re.Pattern[str] | None = None  # or a log line whose group 1 is host:port
    health: str | None = "/health"  # GET answering 200 once it serves; None: no HTTP
    scheme: str = "http"
    cafile: Path | None = None  # with https: the CA the clients trust
    _bound: dict[str, Any] | None = field(default=None, repr=False)

    def bound(self) -> dict[str, Any] | None:
        """What the process reported ({"listen": "host:port", ...}); None until it has."""
        if self._bound is None:
            if self.ready_file is not None and self.ready_file.exists():
                self._bound = json.loads(self.ready_file.read_text())
            elif self.ready_line is not None and (m := self.ready_line.search(self.log())):
                self._bound = {"listen": m.group(1)}
        return self._bound

    @property
    def listen(self) -> str:
        """host:port it serves on (a wildcard host reads as loopback)."""
        bound = self.bound()
        if bound is None:
            raise NotServing(f"{self.name} has not reported its address yet")
        host, _, port = str(bound["listen"]).rpartition(":")
        return f"{'127.0.0.1' if host in ('0.0.0.0', '[::]', '') else host}:{port}"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.listen}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str, timeout: float = 30.0) -> tuple[int, Any]:
        """GET `path`: (status, JSON body or text)."""
        tls = None if self.cafile is None else ssl.create_default_context(cafile=self.cafile)
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout, context=tls) as resp:
                body, status = resp.read(), resp.status
        except urllib.error.HTTPError as exc:
            body, status = exc.read(), exc.code
        return status, json.loads(body) if body[:1] in (b"{", b"[") else body.decode()

    def get_json(self, path: str) -> Any:
        """GET `path`, which must answer 200 (RuntimeError with the answer otherwise)."""
        status, body = self.get(path)
        if status != 200:
            raise RuntimeError(f"{self.name}: GET {path}: HTTP {status}: {str(body)[:300]}")
        return body

    def wait_status(self, path: str, want: int, timeout: float, every: float = 0.2) -> Any:
        """Poll GET `path` until it answers `want`; that answer's body. Fails with the log
        when the process exits or the time is up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (code := self.proc.poll()) is not None:
                raise RuntimeError(f"{self.name} exited with code {code}:\n{self.log()[-4000:]}")
            try:
                status, body = self.get(path, timeout=10)
                if status == want:
                    return body
            except OSError:
                pass
            time.sleep(every)
        raise RuntimeError(f"{self.name}: {path} never answered {want} in {timeout:g} s:\n"
                           f"{self.log()[-4000:]}")  # fmt: skip

    def up(self, timeout: float = START_TIMEOUT_S) -> Server:
        """Wait until it serves (its address reported, its health check 200); stop it if it
        never does, or if the wait is cut short (an interrupt while a model loads must not
        leave it running)."""
        try:
            if self.health is not None:
                self.wait_status(self.health, 200, timeout)
            else:
                self._wait_bound(timeout)
            return self
        except BaseException:
            self.stop()
            raise

    def _wait_bound(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.bound() is None:
            if (code := self.proc.poll()) is not None:
                raise RuntimeError(f"{self.name} exited with code {code}:\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not report its address in {timeout:g} s")
            time.sleep(0.2)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, and SIGKILL if it is still there after `timeout` (then RuntimeError)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise RuntimeError(f"{self.name} ignored SIGTERM for {timeout:g} s:\n"
                               f"{self.log()[-4000:]}") from None  # fmt: skip


def launch(
    name: str, argv: list[str], folder: Path, env: Mapping[str, str] | None = None, *,
    ready_file: bool = True, wrap: Callable[[list[str]], list[str]] | None = None,
    log_path: Path | None = None,
) -> Server:  # fmt: skip
    """Start `argv` (a command, e.g. [sys.executable, "-m", ...]) without waiting for it;
    with `ready_file` it gets `--ready-file`. `wrap` rewrites the command (a network
    namespace's `ip netns exec`). The child imports this trd first."""
    log_path = log_path or folder / f"{name}.log"
    ready = folder / f"{name}.ready.json" if ready_file else None
    if ready is not None:
        ready.unlink(missing_ok=True)  # a file left by an earlier start says nothing now
        argv = [*argv, "--ready-file", str(ready)]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            wrap(argv) if wrap else argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": path, **(env or {})},
        )  # fmt: skip
    return Server(name, proc, log_path, ready)


# -- our daemon -------------------------------------------------------------------------
@dataclass
class Daemon(Server):
    config: dict[str, Any] = field(default_factory=dict)
    config_path: Path | None = None

    @property
    def admin(self) -> str:
        """The admin API's address for trctl: host:port (bound) or unix:/path."""
        bound = self.bound()
        return str(bound["admin"] if bound else self.config["admin"])

    @property
    def model(self) -> str:
        return "+".join(m["name"] for m in self.config["models"])

    def admin_call(self, method: str, path: str, body: Any = None) -> Any:
        from trd.cli import request

        return request(self.admin, method, path, body, self.config.get("admin_token", ""))

    def wait_ready(self, timeout: float) -> None:
        """Until /ready says every engine serves (the HTTP port opens only after the
        engines' first start, so this also waits for the daemon to come up)."""
        self.wait_status("/ready", 200, timeout)

    def fresh_stats(self, since: float, timeout: float = 300.0) -> dict[str, dict[str, Any]]:
        """Every engine's raw stats, published after wall time `since` (engines publish
        every 0.5 s, and after a step that outlasts that): a snapshot that holds every step
        before `since`. One step can take a minute (a float32 1.5B prefill chunk on one
        thread), hence the timeout."""
        deadline = time.monotonic() + timeout
        while True:
            stats: dict[str, dict[str, Any]] = self.admin_call("GET", "/stats/raw")
            if stats and all(body.get("time", 0.0) > since for body in stats.values()):
                return stats
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no engine stats newer than {since}")
            time.sleep(0.1)


def daemon_config(
    models: Mapping[str, Path], policy: Mapping[str, Any], *, dtype: str = "float32",
    kv_tokens: int = 8192, max_model_len: int = 512, engine: Mapping[str, Any] | None = None,
    per_model: Mapping[str, Mapping[str, Any]] | None = None, **extra: Any,
) -> dict[str, Any]:  # fmt: skip
    """Our daemon's config on the CPU, listen and admin on port 0 (reported in the ready
    file); `per_model` adds keys to a model's entry (e.g. `remote`), `extra` sets or
    replaces top-level keys (`admin`, `batching`, `admin_token`, ...)."""
    entries = [{"name": n, "path": str(p), "dtype": dtype, **(per_model or {}).get(n, {})}
               for n, p in models.items()]  # fmt: skip
    return {
        "listen": "127.0.0.1:0", "admin": "127.0.0.1:0", "device": "cpu", "mps": "off",
        "memory": {"max_kv_tokens": kv_tokens}, "max_model_len": max_model_len,
        "models": entries, "policy": dict(policy), "engine": dict(engine or {}),
        "shutdown": {"grace_s": 5}, **extra,
    }  # fmt: skip


def write_config(cfg: Mapping[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(dict(cfg)))
    return path


def launch_daemon(
    config_path: Path, env: Mapping[str, str] | None = None, args: tuple[str, ...] = (),
    name: str = "daemon",
) -> Daemon:  # fmt: skip
    """`tokenrouterd --config` (`args`: more flags), not waited for; its log beside the
    config (NAME.log)."""
    folder = config_path.parent
    server = launch(name, [sys.executable, "-m", "trd.daemon", "--config", str(config_path),
                           *args], folder, env)  # fmt: skip
    cfg = yaml.safe_load(config_path.read_text())
    scheme = "https" if cfg.get("ssl_certfile") or "--ssl-certfile" in args else "http"
    return Daemon(server.name, server.proc, server.log_path, server.ready_file, scheme=scheme,
                  health="/ready", config=cfg, config_path=config_path)  # fmt: skip


def start_daemon(
    config_path: Path, env: Mapping[str, str] | None = None, timeout: float = START_TIMEOUT_S,
    name: str = "daemon",
) -> Daemon:  # fmt: skip
    daemon = launch_daemon(config_path, env, name=name)
    daemon.up(timeout)
    return daemon


def serve_config(
    name: str, cfg: Mapping[str, Any], folder: Path, timeout: float = START_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> Daemon:  # fmt: skip
    """The daemon of config `cfg` (written to folder/NAME.yaml), serving."""
    folder.mkdir(parents=True, exist_ok=True)
    config = write_config(cfg, folder / f"{name}.yaml")
    return start_daemon(config, env, timeout=timeout, name=name)


# -- the other systems ------------------------------------------------------------------
def std_server_argv(
    model: Path, *, prefix_cache: bool = True, kv_tokens: int = 65536, cpu_linear: str = "torch",
    max_batch_tokens: int | None = None, threads: int = 1,
) -> list[str]:  # fmt: skip
    """A standard server's command line (`trd/bench/std/server.py`), on port 0."""
    argv = [sys.executable, "-m", "trd.bench.std.server", "--model", str(model), "--port", "0",
            "--kv-tokens", str(kv_tokens), "--cpu-linear", cpu_linear,
            "--threads", str(threads)]  # fmt: skip
    if max_batch_tokens is not None:
        argv += ["--max-batch-tokens", str(max_batch_tokens)]
    return argv + ([] if prefix_cache else ["--no-prefix-cache"])


def start_std_server(name: str, model: Path, folder: Path, **settings: Any) -> Server:
    """A standard server of one model (`std_server_argv`'s settings), not yet waited for
    (start several, then `up()` each: their loads overlap)."""
    return launch(name, std_server_argv(model, **settings), folder)


def launch_engine_host(
    config_path: Path, model: str, listen: str, folder: Path,
    wrap: Callable[[list[str]], list[str]] | None = None, name: str = "remote",
) -> Server:  # fmt: skip
    """`tokenrouterd engine` for `model` listening on `listen` (host:port; port 0: any,
    reported), `wrap`: e.g. inside a network namespace. `up()` waits for its ready file
    (no HTTP: no health check); its log is folder/NAME.log, appended at each start."""
    argv = [sys.executable, "-m", "trd.daemon", "engine", "--config", str(config_path),
            "--model", model, "--listen", listen]  # fmt: skip
    server = launch(name, argv, folder, wrap=wrap)
    server.health = None
    return server
