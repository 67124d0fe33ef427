"""The one launcher (`trd/bench/server.py`): a server still loading when its start is cut
short, or that dies while loading, is not left behind (`Server.up` stops it and says how
it ended); a server is found where it reported it listens, on the port it bound itself."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from trd.bench import server
from trd.bench.server import NotServing, Server, launch, start_std_server


def loading_server(tmp_path: Path, code: str) -> Server:
    return launch("loading", [sys.executable, "-c", code], tmp_path, ready_file=False)


def test_an_interrupted_start_stops_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    srv = loading_server(tmp_path, "import time; time.sleep(120)")
    real_sleep, calls = time.sleep, []

    def interrupt_once(seconds: float) -> None:  # Ctrl-C during the first wait, then real
        calls.append(seconds)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real_sleep(seconds)

    monkeypatch.setattr(server.time, "sleep", interrupt_once)
    with pytest.raises(KeyboardInterrupt):
        srv.up()
    assert srv.proc.poll() is not None  # stopped, not orphaned


def test_a_server_that_dies_while_loading_is_reported_with_its_exit_code(
    tmp_path: Path,
) -> None:
    srv = loading_server(tmp_path, "print('loading the weights'); raise SystemExit(3)")
    with pytest.raises(RuntimeError, match=r"loading exited with code 3:\nloading the weights"):
        srv.up()


def test_a_standard_server_binds_port_0_and_reports_the_port(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    srv = start_std_server("std_small", tiny_models["small"], tmp_path, kv_tokens=1024)
    with pytest.raises(NotServing):
        srv.url  # noqa: B018 -- nothing reported yet
    try:
        srv.up(120)
        assert srv.bound() is not None and srv.port > 0
        status, body = srv.get("/profile")
        assert status == 200 and body["calls"] == 0 and body["prefix_cache"] is True
    finally:
        assert srv.stop() == 0, srv.log()
