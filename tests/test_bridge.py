"""Two bridges over loopback TCP between real rings, as a daemon's host and an engine's.

Node 1 is the "remote" engine: side A (the daemon's host) has the front end and engine 0,
side B has engine 1. The test plays every producer and consumer.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import struct
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest

from trd.ipc.counters import Counters
from trd.ipc.mesh import Mesh
from trd.ipc.names import FRONTEND, instance_prefix
from trd.ipc.ring import Ring
from trd.protocol import PeerKind, PeerReq, decode, encode
from trd.remote import bridge as bridge_mod
from trd.remote import envelope
from trd.remote.bridge import Bridge, Edge
from trd.remote.envelope import Envelope, Kind

REMOTE = 1


class Side:
    """One host's rings for the edges touching the remote engine, and its counters."""

    def __init__(self, host: str, capacity: int = 1 << 20) -> None:
        prefix = instance_prefix(os.getpid(), secrets.token_hex(4))
        # A: the remote engine's endpoint as the daemon's host has it; B: its own rings.
        self.mesh = Mesh(prefix, 2, capacity, only=REMOTE)
        self.counters = Counters.create(prefix + "counters", 2)
        crossing = (lambda e: e[1] == REMOTE) if host == "A" else (lambda e: e[0] == REMOTE)
        self.egress = {e: r for e, r in self.mesh.rings.items() if crossing(e)}
        self.ingress = {e: r for e, r in self.mesh.rings.items() if not crossing(e)}
        self.own = (
            [s for s in range(5) if s not in self.counters.engine_slots(REMOTE)]
            if host == "A"
            else list(self.counters.engine_slots(REMOTE))
        )

    def bridge(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Bridge:
        return Bridge(reader, writer, self.egress, self.ingress, self.counters, self.own)

    def close(self) -> None:
        self.mesh.unlink_all()
        self.counters.close()


@pytest.fixture
def sides() -> Iterator[tuple[Side, Side]]:
    a, b = Side("A"), Side("B")
    yield a, b
    a.close()
    b.close()


@asynccontextmanager
async def linked(a: Side, b: Side) -> AsyncIterator[tuple[asyncio.Task[str], asyncio.Task[str]]]:
    """Both bridges running over one loopback connection."""
    accepted: asyncio.Queue[asyncio.Task[str]] = asyncio.Queue()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(asyncio.current_task())  # type: ignore[arg-type]
        await b.bridge(reader, writer).run()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    task_a = asyncio.get_running_loop().create_task(a.bridge(reader, writer).run())
    task_b = await accepted.get()
    try:
        yield task_a, task_b
    finally:
        task_a.cancel()  # closes A's end: B's bridge sees the end of the stream
        await asyncio.gather(task_a, asyncio.wait_for(task_b, 10), return_exceptions=True)
        server.close()


async def collect(ring: Ring, n: int, timeout: float = 20.0, slow: bool = False) -> list[bytes]:
    """`n` frames from `ring`; `slow`: a few at a time, like a busy consumer."""
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += ring.get_all(4 if slow else None)
        await asyncio.sleep(0.002 if slow else 0.0005)
    return out


def peer_req(i: int) -> bytes:
    msg = PeerReq.control(PeerKind.FINISH, i, i)
    msg.sent_at = time.perf_counter()
    return encode(msg)


def test_frames_cross_both_ways_on_their_own_edges_in_order(sides: tuple[Side, Side]) -> None:
    a, b = sides

    async def run() -> dict[Edge, list[bytes]]:
        async with linked(a, b):
            frames = {edge: [f"{edge}:{i}".encode() for i in range(50)] for edge in a.egress}
            frames |= {edge: [f"{edge}:{i}".encode() for i in range(50)] for edge in b.egress}
            for side in (a, b):
                for edge, ring in side.egress.items():
                    for frame in frames[edge]:
                        assert ring.try_put(frame)
            got = {}
            for side in (b, a):
                for edge, ring in side.ingress.items():
                    got[edge] = await collect(ring, 50)
                    assert got[edge] == frames[edge], edge
            return got

    got = asyncio.run(run())
    assert sorted(got) == sorted([(FRONTEND, REMOTE), (0, REMOTE), (REMOTE, FRONTEND), (REMOTE, 0)])


def test_a_peer_requests_sent_at_keeps_its_meaning_across(sides: tuple[Side, Side]) -> None:
    a, b = sides

    async def run() -> list[tuple[float, float]]:
        async with linked(a, b):
            await asyncio.sleep(0.6)  # a heartbeat: the round trip is measured
            pairs = []
            for i in range(20):
                frame = peer_req(i)
                sent = decode(frame).sent_at  # type: ignore[union-attr]
                a.egress[0, REMOTE].try_put(frame)
                [arrived] = await collect(b.ingress[0, REMOTE], 1)
                pairs.append((sent, decode(arrived).sent_at))  # type: ignore[union-attr]
            return pairs

    for sent, arrived in asyncio.run(run()):
        # Same clock on both sides here: the age plus half a round trip lands close by.
        assert abs(arrived - sent) < 0.01


def test_a_full_ring_holds_the_stream_back_and_loses_nothing() -> None:
    """B's consumer is slow: B's ring fills, then TCP's window, then A's ring, whose
    producer must wait (back-pressure end to end); every frame arrives, in order."""
    a, b = Side("A", capacity=64 << 10), Side("B", capacity=16 << 10)
    # 0xff: no message tag, so the bridge passes the bytes through untouched.
    frames = [b"\xff" + struct.pack("<I", i) + bytes(2000) for i in range(2500)]
    stalls = 0

    async def run() -> list[bytes]:
        nonlocal stalls
        async with linked(a, b) as (task_a, task_b):
            ring = a.egress[0, REMOTE]
            reader = asyncio.get_running_loop().create_task(
                collect(b.ingress[0, REMOTE], len(frames), timeout=60, slow=True)
            )
            for frame in frames:
                while not ring.try_put(frame):
                    stalls += 1
                    await asyncio.sleep(0.001)
            got = await reader
            assert not task_a.done() and not task_b.done(), "the link must survive the stall"
            return got

    try:
        assert asyncio.run(run()) == frames
    finally:
        a.close()
        b.close()
    assert stalls > 0, "A's producer never had to wait: the test pushed too little"


def test_counters_are_mirrored_each_way_for_the_slots_each_side_owns(
    sides: tuple[Side, Side],
) -> None:
    a, b = sides
    a.counters.set_active(5)
    a.counters.set_busy(0, 2)
    b.counters.set_busy(REMOTE, 3)
    b.counters.set_active(99)  # not B's to publish: A's value must win there

    async def run() -> None:
        async with linked(a, b):
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if (b.counters.active, b.counters.busy(0), a.counters.busy(REMOTE)) == (5, 2, 3):
                    return
                await asyncio.sleep(0.05)

    asyncio.run(run())
    assert (b.counters.active, b.counters.busy(0), a.counters.busy(REMOTE)) == (5, 2, 3)
    assert a.counters.active == 5


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\x07\x00\x01", r"malformed frame from the peer: unknown link frame kind 7"),
        (envelope.encode(Envelope(Kind.FRAME, 0, FRONTEND, b"x")), r"not an edge this link"),
        (envelope.encode(envelope.counters({2: 4})), r"slots \[2\] the peer does not own"),
        (b"", "peer closed the connection|connection lost: .*reset"),
    ],
)
def test_a_bad_peer_ends_the_link_with_a_reason_and_never_raises(
    sides: tuple[Side, Side], raw: bytes, reason: str
) -> None:
    """Side B's bridge facing a peer that writes raw bytes, then (for b"") hangs up."""
    _, b = sides

    async def run() -> str:
        result: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            result.set_result(await b.bridge(reader, writer).run())

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        if raw:
            writer.write(len(raw).to_bytes(4, "little") + raw)
        else:
            writer.close()
        try:
            return await asyncio.wait_for(result, 10)
        finally:
            writer.close()
            server.close()

    assert re.search(reason, asyncio.run(run()))


def test_a_silent_peer_is_declared_dead(
    sides: tuple[Side, Side], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pulled cable sends no FIN: silence for DEAD_AFTER_S ends the link."""
    monkeypatch.setattr(bridge_mod, "DEAD_AFTER_S", 0.3)
    _, b = sides

    async def run() -> tuple[str, float]:
        result: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            result.set_result(await b.bridge(reader, writer).run())

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        start = time.monotonic()
        try:
            return await asyncio.wait_for(result, 10), time.monotonic() - start
        finally:
            writer.close()
            server.close()

    reason, took = asyncio.run(run())
    assert "nothing heard for 0.3 s" in reason
    assert took < 3.0
