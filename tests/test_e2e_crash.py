"""Crashes around the daemon, through the real processes: the supervisor SIGKILLed while
its engines start and while they serve, an engine killed with no restart left, an engine
that fails to start.

After the supervisor dies nothing of it may survive: no engine process, nor a thread of
one (`proc_tree.alive` reads every thread: a process whose main thread exited is not
gone), no shared-memory segment. The engines die by their parent-death signal
(trd/engines/boot.py); the segments go with the multiprocessing resource tracker.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from safetensors.torch import load_file, save_file

from trd.cli import request

from daemon_fixture import Daemon, launch_daemon, shm_segments, start_daemon, write_config
from proc_tree import alive, children

PROMPT = "def main("
# The main thread exits (the leader turns zombie) while another thread runs on.
LEADER_EXITS = """
import ctypes, sys, threading, time
threading.Thread(target=time.sleep, args=(60,)).start()
print("started", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def stream_until_error(d: Daemon, max_tokens: int, started: threading.Barrier) -> str | None:
    """Stream one completion; the error that ended it (None: it completed)."""
    stream = d.client().completions.create(
        model=d.model, prompt=PROMPT, max_tokens=max_tokens, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    try:
        for i, _ in enumerate(stream):
            if i == 0:
                started.wait(30)
    except Exception as exc:  # the server went away: the client's own error type
        return f"{type(exc).__name__}: {exc}"
    return None


def wait_all_gone(d: Daemon, kids: list[int], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(k) for k in kids) or shm_segments(d.proc.pid):
        assert time.monotonic() < deadline, ([k for k in kids if alive(k)], d.log())
        time.sleep(0.1)


def test_a_process_whose_main_thread_exited_is_alive() -> None:
    """The check the tests below rely on: a zombie leader with a live thread is alive."""
    proc = subprocess.Popen([sys.executable, "-c", LEADER_EXITS], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
        deadline = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert alive(proc.pid)
    finally:
        proc.kill()
        proc.wait(10)
    assert not alive(proc.pid)


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
    wait_all_gone(d, kids)


def test_supervisor_killed_while_serving_leaves_nothing_and_starts_again(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    """SIGKILL to the supervisor with streams running on both engines: the clients get
    an error, not a hang; engines, tracker and segments go; the same config starts again
    (its admin socket file left behind, its port), as systemd's Restart= would."""
    config = write_config(tmp_path, tiny_models, ["small", "large"])
    d = start_daemon(config)
    kids = children(d.proc.pid)
    engines = {e["pid"] for e in d.status()["engines"]}
    assert engines < set(kids), (engines, kids)  # and the resource tracker
    started = threading.Barrier(3)
    with ThreadPoolExecutor(2) as pool:
        running = [pool.submit(stream_until_error, d, 480, started) for _ in range(2)]
        started.wait(30)
        d.proc.kill()
        d.proc.wait(10)
        assert all(f.result(timeout=30) is not None for f in running)
    wait_all_gone(d, kids)
    assert Path(d.admin.removeprefix("unix:")).exists()  # left by the killed supervisor
    again = start_daemon(config)
    try:
        out = again.client().completions.create(model=again.model, prompt=PROMPT, max_tokens=4)
        assert out.usage is not None and out.usage.completion_tokens == 4
    finally:
        assert again.stop() == 0, again.log()


def test_killed_engine_without_retries_exits_non_zero(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    d = start_daemon(write_config(tmp_path, tiny_models, ["small"], restart={"max_retries": 0}))
    try:
        pid = request(d.admin, "GET", "/status")["engines"][0]["pid"]
        started = threading.Barrier(2)
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(stream_until_error, d, 480, started)
            started.wait(30)
            os.kill(pid, signal.SIGKILL)
            error = running.result(timeout=30)
        assert error is not None and "died" in error, error
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
    d = launch_daemon(write_config(tmp_path, {"broken": broken}, ["broken"]))
    assert d.proc.wait(120) == 1, d.log()
    text = d.log()
    error = text[text.index("engine 'broken' failed to start") :]
    assert "missing: ['model.norm.weight']" in error
    assert "last log lines of engine 'broken':" in error
    assert "ERROR engine[broken] failed to start" in error.split("last log lines")[1]
    assert shm_segments(d.proc.pid) == []
