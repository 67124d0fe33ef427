"""The large model on another host: `tokenrouterd engine` in a second network namespace,
joined to this one by a veth pair with link-local addresses; the daemon runs here.

Both hosts read one config file (float64, scripted routing with handoffs both ways; the
remote large model prefills each prompt ahead, `prefill_ahead`, so Submits cross too).
One remote engine host serves the whole module, in this order:

    engines across the hosts equal the reference loop at concurrency 1, 4 and 16
    the daemon shows the remote engine in `trctl status`, with its stats
    connections that are not our protocol, or bring a wrong token or version, are
    refused and logged, and never touch the daemon's link
    a pulled cable, then a killed remote host: streams fail with a clear error, /ready
    goes false, and the daemon reconnects once the remote is back
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from transformers import AutoTokenizer

from trd.bench.engines import run_closed_loop
from trd.bench.server import Server, launch_engine_host
from trd.cli import format_status
from trd.config import load_config
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.remote.handshake import Hello, Refused, connect
from trd.remote.spec import RemoteSpec
from trd.supervisor.deployment import plan_deployment
from trd.supervisor.group import EngineGroup
from trd.testing.netns import NetNs, why_not
from trd.testing.reference import ReferenceRouter
from trd.testing.wiring import check_fed

from daemon_fixture import Daemon, launch_daemon, shm_segments, wait_serving
from routing_cases import cache_hits, fresh_stats, jobs, reference

PORT = 7070
TOKEN = "remote-test-token-0123456789"
SCHEDULE = [0, 0, 1, 0, 1, 1]
POLICY = {"schedule": SCHEDULE}
PROMPT = "def parse("
START_S = 150.0


class RemoteHost:
    """`tokenrouterd engine` for the large model, inside the namespace (its own network:
    the fixed port races with nothing)."""

    def __init__(self, ns: NetNs, config: Path) -> None:
        self.ns, self.config = ns, config
        self.log_path = config.parent / "remote.log"
        self.server: Server | None = None

    @property
    def address(self) -> str:
        return f"{self.ns.peer_ip}:{PORT}"

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return None if self.server is None else self.server.proc

    def start(self) -> None:
        host = launch_engine_host(self.config, "large", self.address, self.config.parent,
                                  self.ns.command)  # fmt: skip
        self.server = host.up(START_S)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, pattern: str, since: int = 0, timeout: float = 20.0) -> re.Match[str]:
        """The first match of `pattern` in the log after its first `since` characters."""
        deadline = time.monotonic() + timeout
        while (found := re.search(pattern, self.log()[since:])) is None:
            assert time.monotonic() < deadline, f"no {pattern!r} in the remote's log:\n{self.log()}"
            time.sleep(0.1)
        return found

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(30)


@pytest.fixture(scope="module")
def ns() -> Iterator[NetNs]:
    reason = why_not()
    if reason is not None:
        pytest.skip(f"needs network namespaces (root, CAP_NET_ADMIN): {reason}")
    with NetNs() as made:
        yield made


@pytest.fixture(scope="module")
def config(
    ns: NetNs, tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """One file for both hosts: `path` says where the remote host finds its checkpoint."""
    tmp = tmp_path_factory.mktemp("remote_engine")
    raw = {
        "listen": "127.0.0.1:0", "admin": f"unix:{tmp / 'admin.sock'}",
        "device": "cpu", "mps": "off", "memory": {"max_kv_tokens": 16384},
        "max_model_len": 2048,
        "models": [
            {"name": "small", "path": str(tiny_models["small"]), "dtype": "float64"},
            {"name": "large", "path": str(tiny_models["large"]), "dtype": "float64",
             "remote": f"{ns.peer_ip}:{PORT}", "prefill_ahead": True},
        ],
        "remote_token": TOKEN, "policy": {"name": "scripted", **POLICY},
        "engine": {"threads": 1, "max_batch_tokens": 512},
        "shutdown": {"grace_s": 3}, "restart": {"max_retries": 2, "backoff_s": 0.2},
    }  # fmt: skip
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def remote(ns: NetNs, config: Path) -> Iterator[RemoteHost]:
    host = RemoteHost(ns, config)
    host.start()
    yield host
    assert host.proc is not None
    pid = host.proc.pid
    assert host.stop() == 0, host.log()
    assert shm_segments(pid) == [], "the remote host left shared memory behind"


@pytest.fixture(scope="module")
def daemon(remote: RemoteHost, config: Path) -> Iterator[Daemon]:
    d = wait_serving(launch_daemon(config))
    yield d
    assert d.stop() == 0, d.log()
    assert shm_segments(d.proc.pid) == []


# -- the oracle ----------------------------------------------------------------------------
def test_engines_across_hosts_equal_the_reference(
    config: Path, remote: RemoteHost, tiny_models: dict[str, Path]
) -> None:
    """Built as the daemon builds them: the small engine here, the large one remote."""
    specs = plan_deployment(load_config(config)).specs
    assert isinstance(specs[1], RemoteSpec) and specs[1].address.port == PORT
    paths = [tiny_models["small"], tiny_models["large"]]
    work = jobs(paths[0], count=16)
    expected = reference(paths, "scripted", POLICY, work)
    assert all({0, 1} <= set(t.models) for t in expected), "handoffs both ways in every job"
    group = EngineGroup(specs)
    group.start(timeout=START_S)
    try:
        before = cache_hits(group, 2)
        for concurrency in (1, 4, 16):
            results = run_closed_loop(group, work, concurrency)
            for i, (got, want) in enumerate(zip(results, expected, strict=True)):
                assert got.error == "", got.error
                assert got.tokens == want.tokens, f"c={concurrency} request {i}"
                assert got.models == want.models, f"c={concurrency} request {i}"
                assert got.finish == want.finish
            # The remote engine's Done and stats crossed too: each model fed each token
            # once or took it from its prefix cache (the runs at 4 and 16 repeat prompts).
            after = cache_hits(group, 2)
            check_fed(results, expected, {m: after[m] - before[m] for m in after})
            before = after
        # Every prompt longer than a block was sent across to be prefilled ahead; one
        # whose handoff crossed first (another link) came late and was not.
        page = specs[1].settings.page_size
        long = sum(len(p) > page for p, _ in work)
        large = fresh_stats(group, 1)
        assert large["prefills_ahead"] + large["prefills_late"] == 3 * long > 0, large
        # Which comes first is a race above; with the entry engine stopped, the prompt
        # must cross the link and be prefilled ahead before its request can follow.
        i = next(i for i, (p, _) in enumerate(work) if len(p) > page)
        small = group.procs[0].pid
        assert small is not None
        os.kill(small, signal.SIGSTOP)
        try:
            gen = group.submit(*work[i])
            deadline = time.monotonic() + 30
            while fresh_stats(group, 1)["prefills_ahead"] == large["prefills_ahead"]:
                assert time.monotonic() < deadline, "the prompt never reached the remote engine"
        finally:
            os.kill(small, signal.SIGCONT)
        while not (gen.complete and (gen.all_done or gen.error)):
            group.pump(timeout=0.05)
        assert (gen.error, gen.tokens, gen.models) == ("", expected[i].tokens, expected[i].models)
    finally:
        group.close()


# -- the daemon ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def oracle_text(tiny_models: dict[str, Path]) -> str:
    tok = AutoTokenizer.from_pretrained(tiny_models["small"])
    ref = ReferenceRouter([tiny_models["small"], tiny_models["large"]],
                          PolicySpec("scripted", POLICY))  # fmt: skip
    trace = ref.run(tok.encode(PROMPT), SamplingParams(max_tokens=24, ignore_eos=True))
    return str(tok.decode(trace.tokens, skip_special_tokens=True))


def complete(d: Daemon, max_tokens: int = 24) -> dict[str, Any]:
    r = d.client().completions.create(
        model=d.model, prompt=PROMPT, max_tokens=max_tokens, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    return {"text": r.choices[0].text, **(r.model_extra or {})}


def test_trctl_status_shows_the_remote_engine_and_its_stats(
    daemon: Daemon, remote: RemoteHost, tiny_models: dict[str, Path], oracle_text: str
) -> None:
    out = complete(daemon)
    assert out["text"] == oracle_text
    assert out["tokens_per_model"]["large"] > 0
    deadline = time.monotonic() + 10
    while (large := daemon.status()["engines"][1])["tokens_committed"] in (None, 0):
        assert time.monotonic() < deadline, f"no stats crossed the link: {large}"
        time.sleep(0.2)
    assert large["remote"] == remote.address and large["state"] == "connected"
    assert large["path"] == str(tiny_models["large"]) and large["device"] == "cpu"
    assert large["kv_pages_total"] > 0 and large["tokens_committed"] >= 12
    text = format_status(daemon.status())
    assert re.search(rf"1\s+large\s+{re.escape(remote.address)}\s+\d+\s+cpu\s+float64\s+"
                     r"none\s+\S+\s+connected", text), text  # then quant, weights  # fmt: skip


def test_foreign_connections_are_refused_logged_and_leave_the_link_alone(
    daemon: Daemon, remote: RemoteHost, ns: NetNs
) -> None:
    before = daemon.status()
    silent = socket.create_connection((ns.peer_ip, PORT), timeout=10)  # says nothing

    async def attempt(token: str, hello: Hello | None = None) -> str:
        reader, writer = await asyncio.open_connection(ns.peer_ip, PORT)
        try:
            await connect(reader, writer, token, "large", hello)
        except Refused as exc:
            return str(exc)
        finally:
            writer.close()
        return "accepted"

    assert "wrong token" in asyncio.run(attempt("not-the-token-0123456789"))
    version = asyncio.run(attempt(TOKEN, Hello(os.urandom(32), "large", link_version=99)))
    assert "link protocol 99" in version
    silent.settimeout(9)
    assert silent.recv(16) == b"", "the remote answered a client that said nothing"
    silent.close()
    me = re.escape(ns.host_ip)
    remote.wait_log(rf"refused a connection from {me}:\d+: wrong token")
    remote.wait_log(rf"refused a connection from {me}:\d+: link protocol 99")
    remote.wait_log(rf"refused a connection from {me}:\d+: no handshake within 5 s")
    after = daemon.status()
    assert after["state"] == "serving" and after["restarts"] == before["restarts"]
    assert after["engines"][1]["pid"] == before["engines"][1]["pid"]
    assert daemon.get("/ready")[0] == 200


class Stream(threading.Thread):
    """A streaming completion read to its end; `started` once text arrived."""

    def __init__(self, d: Daemon) -> None:
        super().__init__(daemon=True)
        self.d, self.body, self.started = d, "", threading.Event()
        self.start()

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.d.port, timeout=60)
        req = {"model": self.d.model, "prompt": PROMPT, "max_tokens": 2000, "temperature": 0,
               "ignore_eos": True, "stream": True}  # fmt: skip
        conn.request("POST", "/v1/completions", json.dumps(req),
                     {"Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        for line in resp:
            self.body += line.decode()
            if '"text": "' in self.body:
                self.started.set()
        conn.close()


def interrupted_streams(d: Daemon, cut: Any) -> list[str]:
    streams = [Stream(d) for _ in range(4)]
    for s in streams:
        assert s.started.wait(60), "no text streamed"
    cut()
    for s in streams:
        s.join(60)
        assert not s.is_alive(), "a stream hangs after the remote engine was lost"
    return [s.body for s in streams]


def assert_lost_then_back(
    d: Daemon, remote: RemoteHost, bodies: list[str], restore: Any, oracle_text: str
) -> None:
    lost = f"remote engine 'large' at {remote.address}: connection lost"
    for body in bodies:
        assert lost in body and '"code": "engine_error"' in body, body[-500:]
    status, ready = d.get("/ready")
    assert status == 503 and lost in ready["reason"], ready
    assert d.status()["engines"][1]["state"] == "disconnected"
    restore()
    d.wait_ready(START_S)
    assert complete(d)["text"] == oracle_text
    assert d.status()["engines"][1]["state"] == "connected"


def test_a_pulled_cable_fails_the_streams_and_the_daemon_reconnects(
    daemon: Daemon, remote: RemoteHost, ns: NetNs, oracle_text: str
) -> None:
    assert remote.proc is not None
    since = len(remote.log())
    bodies = interrupted_streams(daemon, lambda: ns.set_link(False))
    assert_lost_then_back(daemon, remote, bodies, lambda: ns.set_link(True), oracle_text)
    # The remote side heard nothing either: it dropped the streams' requests and lives on.
    remote.wait_log(r"link from .* ended: connection lost: nothing heard for 3 s", since)
    dropped = remote.wait_log(r"dropped (\d+) request\(s\)", since)
    assert int(dropped.group(1)) >= 1, "the streams' requests were not on the remote engine"
    assert remote.proc.poll() is None


def test_a_killed_remote_host_fails_the_streams_and_the_daemon_reconnects(
    daemon: Daemon, remote: RemoteHost, oracle_text: str
) -> None:
    bodies = interrupted_streams(daemon, lambda: remote.stop(signal.SIGKILL))
    assert_lost_then_back(daemon, remote, bodies, remote.start, oracle_text)
