"""A benchmark server that is still loading when its start is cut short, or that dies
while loading, is not left behind: `Server.up` stops it and says how it ended."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchkit import systems
from benchkit.systems import Server, free_port


def loading_server(tmp_path: Path, code: str) -> Server:
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=out)
    return Server("loading", proc, f"http://127.0.0.1:{free_port()}", log)


def test_an_interrupted_start_stops_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = loading_server(tmp_path, "import time; time.sleep(120)")
    real_sleep, calls = time.sleep, []

    def interrupt_once(seconds: float) -> None:  # Ctrl-C during the first wait, then real
        calls.append(seconds)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real_sleep(seconds)

    monkeypatch.setattr(systems.time, "sleep", interrupt_once)
    with pytest.raises(KeyboardInterrupt):
        server.up()
    assert server.proc.poll() is not None  # stopped, not orphaned


def test_a_server_that_dies_while_loading_is_reported_with_its_exit_code(
    tmp_path: Path,
) -> None:
    server = loading_server(tmp_path, "print('loading the weights'); raise SystemExit(3)")
    with pytest.raises(RuntimeError, match=r"loading exited with code 3:\nloading the weights"):
        server.up()
