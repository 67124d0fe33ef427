"""The daemon's life: systemd notifications, an engine killed with SIGKILL, SIGTERM drain.

Every scenario is bounded in time: a request must end (complete or a clean error)
and the process must exit within limits, leaving no shared-memory segment behind.
"""

from __future__ import annotations

import http.client
import os
import shutil
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
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from trd.cli import request
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.testing.reference import ReferenceRouter

from daemon_fixture import SCHEDULE, Daemon, launch_daemon, shm_segments, start_daemon, write_config

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


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path], notify: NotifyListener
) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("e2e_lifecycle")
    extra = {
        "restart": {"max_retries": 1, "backoff_s": 0.2},
        "shutdown": {"grace_s": 0.5},  # long streams outlast it, short ones end within it
        "stall_timeout_s": 3,
        # Auto mode on, from thresholds no recommendation can keep (B = 3 at N = 1).
        "batching": {"thresholds": {"large": [3]}, "auto_interval_s": 1.0},
    }
    d = start_daemon(
        write_config(tmp, tiny_models, ["small", "large"], dtype="float64", **extra),
        env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "400000"},
    )
    yield d
    d.stop()


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
    deadline = time.monotonic() + 30
    # Ticks before every engine has reported live latencies log "skipped"; wait for a decision.
    while time.monotonic() < deadline and "thresholds auto: {" not in daemon.log():
        time.sleep(0.2)
    assert "thresholds auto: {'small': (1,), 'large': (3,)} ->" in daemon.log()
    view = request(daemon.admin, "GET", "/thresholds")
    assert view["models"]["large"]["set"][0] == 1  # B must be 1 with one active request


def test_a_hung_engine_fails_its_requests_after_the_stall_timeout(daemon: Daemon) -> None:
    """An engine that stops reporting (SIGSTOP: alive, silent) never leaves a client hanging."""
    large = daemon.status()["engines"][1]
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
    assert daemon.status()["restarts"] == 0


def test_killed_engine_fails_its_requests_and_the_daemon_recovers(daemon: Daemon) -> None:
    large = request(daemon.admin, "GET", "/status")["engines"][1]
    started = threading.Barrier(3)
    probe = Prober(daemon)
    try:
        with ThreadPoolExecutor(2) as pool:
            running = [pool.submit(stream_text, daemon, 400, started) for _ in range(2)]
            started.wait(30)
            os.kill(large["pid"], signal.SIGKILL)
            for fut in running:
                with pytest.raises(openai.APIError, match="died"):
                    fut.result(timeout=30)
        daemon.wait_ready(timeout=90)
    finally:
        probe.close()
    # Not ready while the engines restart, and why; alive all along (no container restart).
    _, body = probe.first_not_ready()
    assert body["status"] == "restarting", body
    assert body["reason"].startswith("restarting engines after: engine 'large'"), body
    assert {health for *_, health in probe.seen} == {200}
    status = request(daemon.admin, "GET", "/status")
    assert status["restarts"] == 1
    assert all(e["state"] == "ready" for e in status["engines"])
    assert status["engines"][1]["pid"] != large["pid"]
    assert stream_text(daemon, 8)
    # Only the new engine group's rings (and counters) exist.
    prefixes = {"-".join(n.split("-")[:3]) for n in shm_segments(daemon.proc.pid)}
    assert len(prefixes) == 1, prefixes


def oracle_text(tiny_models: dict[str, Path], max_tokens: int) -> str:
    """What the routing oracle makes of the streams' prompt (float64, the daemon's policy)."""
    tok = AutoTokenizer.from_pretrained(tiny_models["small"])
    ref = ReferenceRouter(
        [tiny_models["small"], tiny_models["large"]], PolicySpec("scripted", {"schedule": SCHEDULE})
    )
    trace = ref.run(tok.encode(PROMPT), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return str(tok.decode(trace.tokens, skip_special_tokens=True))


def test_sigterm_during_8_streams_drains_and_exits_0(
    daemon: Daemon, notify: NotifyListener, tiny_models: dict[str, Path]
) -> None:
    """Streams that can end within the grace period end exactly as the oracle says; the
    others get a "shutting down" error, never a cut text that looks complete."""
    lengths = [8, 8, 8, 8, 480, 480, 480, 480]
    expected = {n: oracle_text(tiny_models, n) for n in set(lengths)}
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


def test_killed_engine_without_retries_exits_non_zero(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    d = start_daemon(write_config(tmp_path, tiny_models, ["small"], restart={"max_retries": 0}))
    try:
        pid = request(d.admin, "GET", "/status")["engines"][0]["pid"]
        started = threading.Barrier(2)
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(stream_text, d, 480, started)
            started.wait(30)
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(openai.APIError, match="died"):
                running.result(timeout=30)
        assert d.proc.wait(30) == 1
        assert "giving up after 0 restart(s)" in d.log()
        assert shm_segments(d.proc.pid) == []
    finally:
        d.stop()


def test_engine_that_fails_to_start_is_named_with_its_last_log_lines(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_models["small"], broken)
    weights = load_file(broken / "model.safetensors")
    weights["model.norm.wrong"] = weights.pop("model.norm.weight")  # headers still plan fine
    save_file(weights, broken / "model.safetensors")
    config = write_config(tmp_path, {"broken": broken}, ["broken"])
    d = launch_daemon(config)
    assert d.proc.wait(120) == 1, d.log()
    text = d.log()
    error = text[text.index("engine 'broken' failed to start") :]
    assert "missing: ['model.norm.weight']" in error
    assert "last log lines of engine 'broken':" in error
    assert "ERROR engine[broken] failed to start" in error.split("last log lines")[1]
    assert shm_segments(d.proc.pid) == []


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_supervisor_killed_while_engines_start_leaves_no_process_or_segment(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    d = launch_daemon(write_config(tmp_path, tiny_models, ["small", "large"]))
    deadline = time.monotonic() + 60
    while len(kids := children(d.proc.pid)) < 3:  # two engines and the resource tracker
        assert time.monotonic() < deadline and d.proc.poll() is None, d.log()
        time.sleep(0.01)
    assert "engines ready" not in d.log()  # still starting
    d.proc.kill()
    d.proc.wait(10)
    deadline = time.monotonic() + 20
    while any(alive(k) for k in kids) or shm_segments(d.proc.pid):
        assert time.monotonic() < deadline, ([k for k in kids if alive(k)], d.log())
        time.sleep(0.1)
