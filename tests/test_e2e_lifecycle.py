"""The daemon's life: systemd notifications, either engine of the routed pair killed
with SIGKILL mid-stream, a hung engine, SIGTERM drain.

One daemon serves the module; a test that ends it (SIGTERM) runs last, and if the order
changes, the next test gets a new daemon (`daemon` restarts it). Each test counts the
restarts it causes, not the module's. Every scenario is bounded in time: a request must
end (complete or a clean error) and the process must exit within limits, leaving no
shared-memory segment behind.
"""

from __future__ import annotations

import functools
import http.client
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from trd.cli import request
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.testing.reference import ReferenceRouter

from daemon_fixture import SCHEDULE, Daemon, shm_segments, start_daemon, write_config

STREAM: dict[str, Any] = {"temperature": 0, "stream": True, "extra_body": {"ignore_eos": True}}
PROMPT = "def main("


class NotifyListener:
    """A unix datagram socket standing in for systemd's $NOTIFY_SOCKET."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.path = path
        self.messages: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


class Prober:
    """Polls /ready and /health from a thread; `seen` holds (time, ready status, body,
    health status), None for a probe the server did not answer (it has exited)."""

    def __init__(self, d: Daemon) -> None:
        self.d = d
        self.seen: list[tuple[float, int | None, Any, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ready, body = self.d.get("/ready")
                health = self.d.get("/health")[0]
            except (OSError, http.client.HTTPException):  # the server closed or is closing
                ready, body, health = None, None, None
            self.seen.append((time.monotonic(), ready, body, health))
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def first_not_ready(self) -> tuple[float, Any]:
        """When /ready first answered something else than 200, and its body."""
        (at, body), *_ = [(t, b) for t, r, b, _ in self.seen if r is not None and r != 200]
        return at, body


@pytest.fixture(scope="module")
def notify(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NotifyListener]:
    listener = NotifyListener(tmp_path_factory.mktemp("notify") / "notify.sock")
    yield listener
    listener.close()


class SharedDaemon:
    """The module's daemon, started again if a test ended it."""

    def __init__(self, config: Path, env: dict[str, str]) -> None:
        self.config, self.env = config, env
        self.current: Daemon | None = None

    def get(self) -> Daemon:
        if self.current is None or self.current.proc.poll() is not None:
            self.current = start_daemon(self.config, self.env)
        return self.current


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path], notify: NotifyListener
) -> Iterator[SharedDaemon]:
    tmp = tmp_path_factory.mktemp("e2e_lifecycle")
    extra = {
        "restart": {"max_retries": 4, "backoff_s": 0.2},  # each kill test restarts once
        "shutdown": {"grace_s": 0.5},  # long streams outlast it, short ones end within it
        "stall_timeout_s": 3,
        # Auto mode on, from thresholds no recommendation can keep (B = 3 at N = 1).
        "batching": {"thresholds": {"large": [3]}, "auto_interval_s": 1.0},
    }
    config = write_config(tmp, tiny_models, ["small", "large"], dtype="float64", **extra)
    made = SharedDaemon(config, {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "400000"})
    yield made
    if made.current is not None:
        made.current.stop()


@pytest.fixture
def daemon(shared: SharedDaemon) -> Daemon:
    return shared.get()


def stream_text(d: Daemon, max_tokens: int, started: threading.Barrier | None = None) -> str:
    """Run one streamed completion; returns its text. Waits at `started` after the first chunk."""
    stream = d.client().completions.create(
        model=d.model, prompt=PROMPT, max_tokens=max_tokens, **STREAM
    )
    text = ""
    for i, chunk in enumerate(stream):
        if chunk.choices:
            text += chunk.choices[0].text
        if i == 0 and started is not None:
            started.wait(30)
    return text


def test_systemd_hears_ready_status_and_watchdog(daemon: Daemon, notify: NotifyListener) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and sum("WATCHDOG=1" in m for m in notify.messages) < 2:
        time.sleep(0.1)
    ready = [m for m in notify.messages if "READY=1" in m]
    assert ready and "STATUS=serving small+large" in ready[0]
    assert sum("WATCHDOG=1" in m for m in notify.messages) >= 2


def test_auto_mode_installs_the_recommended_thresholds(daemon: Daemon) -> None:
    assert stream_text(daemon, 24)  # traffic: live latencies and routes on both engines
    # The first decision solves the Markov model for N up to 16: 1-2 s of CPU, 14 s seen
    # at a load average of 8 on 2 cores (30 s was missed twice there)
    deadline = time.monotonic() + 120
    # Ticks before every engine has reported live latencies log "skipped"; wait for a decision.
    while time.monotonic() < deadline and "thresholds auto: {" not in daemon.log():
        time.sleep(0.2)
    assert "thresholds auto: {'small': (1,), 'large': (3,)} ->" in daemon.log()
    view = request(daemon.admin, "GET", "/thresholds")
    assert view["models"]["large"]["set"][0] == 1  # B must be 1 with one active request


def test_a_hung_engine_fails_its_requests_after_the_stall_timeout(daemon: Daemon) -> None:
    """An engine that stops reporting (SIGSTOP: alive, silent) never leaves a client hanging."""
    restarts, large = daemon.status()["restarts"], daemon.status()["engines"][1]
    started = threading.Barrier(2)
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(stream_text, daemon, 400, started)
        started.wait(30)
        os.kill(large["pid"], signal.SIGSTOP)
        try:
            with pytest.raises(openai.APIError, match="no progress from the engines for 3 s"):
                running.result(timeout=30)
        finally:
            os.kill(large["pid"], signal.SIGCONT)
    assert stream_text(daemon, 8)  # the engine is back; the daemon serves on
    assert daemon.status()["restarts"] == restarts  # stalled, not restarted


@pytest.mark.parametrize("victim", [0, 1], ids=["entry engine", "large engine"])
def test_killed_engine_fails_its_requests_and_the_daemon_recovers(
    daemon: Daemon, victim: int
) -> None:
    """SIGKILL to either engine of the pair while two streams run on both (the schedule
    hands each request back and forth): both streams end with an error naming the engine,
    the daemon restarts the pair and serves the oracle's text again."""
    status = request(daemon.admin, "GET", "/status")
    restarts, killed = status["restarts"], status["engines"][victim]
    started = threading.Barrier(3)
    probe = Prober(daemon)
    try:
        with ThreadPoolExecutor(2) as pool:
            running = [pool.submit(stream_text, daemon, 400, started) for _ in range(2)]
            started.wait(30)
            os.kill(killed["pid"], signal.SIGKILL)
            for fut in running:
                with pytest.raises(openai.APIError, match=f"engine '{killed['name']}'.* died"):
                    fut.result(timeout=30)
        daemon.wait_ready(timeout=90)
    finally:
        probe.close()
    # Not ready while the engines restart, and why; alive all along (no container restart).
    _, body = probe.first_not_ready()
    assert body["status"] == "restarting", body
    assert body["reason"].startswith(f"restarting engines after: engine '{killed['name']}'")
    assert {health for *_, health in probe.seen} == {200}
    status = request(daemon.admin, "GET", "/status")
    assert status["restarts"] == restarts + 1
    assert all(e["state"] == "ready" for e in status["engines"])
    assert status["engines"][victim]["pid"] != killed["pid"]
    assert stream_text(daemon, 8) == oracle_text(daemon.config, 8)
    # Only the new engine group's rings (and counters) exist.
    prefixes = {"-".join(n.split("-")[:3]) for n in shm_segments(daemon.proc.pid)}
    assert len(prefixes) == 1, prefixes


@functools.cache
def _oracle(small: str, large: str, max_tokens: int) -> str:
    tok = AutoTokenizer.from_pretrained(small)
    ref = ReferenceRouter(
        [Path(small), Path(large)], PolicySpec("scripted", {"schedule": SCHEDULE})
    )
    trace = ref.run(tok.encode(PROMPT), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return str(tok.decode(trace.tokens, skip_special_tokens=True))


def oracle_text(config: dict[str, Any], max_tokens: int) -> str:
    """What the routing oracle makes of the streams' prompt (float64, the daemon's policy)."""
    small, large = (m["path"] for m in config["models"])
    return _oracle(small, large, max_tokens)


def test_sigterm_during_8_streams_drains_and_exits_0(
    daemon: Daemon, notify: NotifyListener
) -> None:
    """Streams that can end within the grace period end exactly as the oracle says; the
    others get a "shutting down" error, never a cut text that looks complete. (It ends
    the module's daemon: last in the module.)"""
    lengths = [8, 8, 8, 8, 480, 480, 480, 480]
    expected = {n: oracle_text(daemon.config, n) for n in set(lengths)}
    grace = daemon.config["shutdown"]["grace_s"]
    started = threading.Barrier(len(lengths) + 1)

    def outcome(n: int) -> tuple[str, str | None, float]:
        """(text, finish_reason or the error message, when it ended)."""
        stream = daemon.client().completions.create(
            model=daemon.model, prompt=PROMPT, max_tokens=n, **STREAM
        )
        text, finish = "", None
        try:
            for i, chunk in enumerate(stream):
                if chunk.choices:
                    text += chunk.choices[0].text
                    finish = chunk.choices[0].finish_reason or finish
                if i == 0:
                    started.wait(30)
        except openai.APIError as exc:
            return text, f"error: {exc.message}", time.monotonic()
        return text, finish, time.monotonic()

    probe = Prober(daemon)
    try:
        with ThreadPoolExecutor(len(lengths)) as pool:
            futures = [pool.submit(outcome, n) for n in lengths]
            started.wait(60)
            signalled = time.monotonic()
            daemon.proc.send_signal(signal.SIGTERM)
            results = [f.result(timeout=60) for f in futures]
        assert daemon.proc.wait(60) == 0, daemon.log()
    finally:
        probe.close()
    for n, (text, finish, ended) in zip(lengths, results, strict=True):
        if finish == "length":
            assert text == expected[n]
            assert ended - signalled < grace + 1.0  # complete only within the grace period
        else:
            assert finish is not None and "shutting down" in finish, (n, finish)
    assert [r[1] for r in results[:4]] == ["length"] * 4  # short: they all finish in time
    assert any(r[1] != "length" for r in results[4:])  # long: cut at the end of the grace
    # Readiness went false first, while the long streams still ran; liveness held until
    # the server closed.
    at, body = probe.first_not_ready()
    assert body == {"status": "draining", "reason": "server shutting down"}
    assert at < min(ended for _, _, ended in results[4:])
    assert {health for *_, health in probe.seen if health is not None} == {200}
    readies = [ready for _, ready, _, _ in probe.seen if ready is not None]
    assert readies == sorted(readies, key=lambda r: r != 200)  # never ready again
    assert any("STOPPING=1" in m for m in notify.messages)
    assert shm_segments(daemon.proc.pid) == []
