"""sd_notify over a real unix datagram socket, as systemd provides it in $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from trd.sdnotify import Notifier


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


def test_ready_status_stopping_and_watchdog_arrive(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    n = Notifier({"NOTIFY_SOCKET": path})
    assert n.ready("serving small+large")
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving small+large"
    assert n.stopping("draining 3 requests")
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=draining 3 requests"
    assert n.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"


def test_abstract_namespace_socket() -> None:
    name = f"trd-test-{secrets.token_hex(4)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).status("starting engines")
        assert sock.recv(4096) == b"STATUS=starting engines"


def test_watchdog_period_is_half_the_interval_for_this_process() -> None:
    assert Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "3000000"}).watchdog_s == 1.5
    mine = {"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": str(os.getpid())}
    assert Notifier(mine).watchdog_s == 1.5
    assert Notifier({**mine, "WATCHDOG_PID": "1"}).watchdog_s is None
    assert Notifier({"WATCHDOG_USEC": "0"}).watchdog_s is None


def test_without_systemd_nothing_is_sent_and_a_dead_socket_is_not_fatal(tmp_path: Path) -> None:
    assert not Notifier({}).enabled
    assert not Notifier({}).ready("x")
    assert not Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")}).ready("x")
