"""One side of a remote-engine link: frames between local rings and one TCP stream.

Every engine, local or remote, talks rings only. On each host a bridge stands in for
the nodes of the other host: it consumes the rings of the edges that cross to the other
host (`egress`) and produces into those that arrive from it (`ingress`):

    host A (daemon)                                  host B (tokenrouterd engine)
    front end --ring--> |        |                   |        | --ring--> remote engine
    small     --ring--> | bridge | == TCP, envelopes =| bridge |
    front end <--ring-- |  (A)   |   (src, dst) each | (B)    | <--ring-- remote engine
    small     <--ring-- |        |                   |        |

Back-pressure, never a drop: a frame for a full ring waits, and while it waits nothing
more is read from the socket, so TCP's window pushes back on the sender. Reading and
writing are separate tasks, and every engine drains its inbound rings while it waits to
send, so two full directions cannot deadlock.

The link is watched: each side PINGs every HEARTBEAT_S and gives up after DEAD_AFTER_S
without a frame (a pulled cable sends no FIN). A malformed frame, an edge the link
does not carry, a closed ring or a dead peer end `run`, which returns why; nothing
raises out of it. PONGs give the round trip, with which PeerReq.sent_at crosses hosts
(`restamp`), and COUNTERS mirror the delayed-batching counters each host writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

from trd.ipc.counters import Counters
from trd.ipc.eventfd import EventFd
from trd.ipc.ring import Ring, RingClosed
from trd.protocol import ProtocolError, restamp
from trd.remote import envelope
from trd.remote.envelope import Envelope, EnvelopeError, Kind
from trd.remote.tcp import MAX_FRAME, read_frame

log = logging.getLogger("trd.bridge")

Edge = tuple[int, int]  # (src node, dst node)
HEARTBEAT_S = 0.5
DEAD_AFTER_S = 3.0
BATCH = 64  # frames taken from one ring before the others get a turn
_PUT_WAIT_MIN, _PUT_WAIT_MAX = 50e-6, 2e-3
_LEN_BYTES = 4


class Bridge:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        egress: dict[Edge, Ring],
        ingress: dict[Edge, Ring],
        counters: Counters | None = None,
        own_slots: Iterable[int] = (),
    ) -> None:
        """`own_slots`: the counter slots this host writes (sent); the peer's are mirrored."""
        self.reader, self.writer = reader, writer
        self.egress, self.ingress = egress, ingress
        self.counters = counters
        self.own = sorted(own_slots)
        every = range(counters.num_slots) if counters is not None else range(0)
        self.theirs = set(every) - set(self.own)
        self.sent_counters: dict[int, int] = {}
        self.rtt = 0.0  # smoothed round trip, seconds
        self.frames_out = self.frames_in = 0
        self._kick = asyncio.Event()

    async def run(self) -> str:
        """Move frames until the link fails or is closed; the reason, in words."""
        loop = asyncio.get_running_loop()
        fds = {ring.wakeup.fileno(): ring.wakeup for ring in self.egress.values()}
        for fd, efd in fds.items():
            loop.add_reader(fd, self._on_wakeup, efd)
        tasks = [
            loop.create_task(self._outbound(), name="bridge-out"),
            loop.create_task(self._inbound(), name="bridge-in"),
            loop.create_task(self._heartbeat(), name="bridge-heartbeat"),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            return _reason(done.pop())
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for fd in fds:
                loop.remove_reader(fd)
            self.writer.close()
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(self.writer.wait_closed(), 1.0)

    def _on_wakeup(self, efd: EventFd) -> None:
        efd.drain()  # level-triggered: an undrained eventfd would call us again at once
        self._kick.set()

    # -- rings -> stream ----------------------------------------------------------------
    async def _outbound(self) -> None:
        while True:
            self._kick.clear()
            if self._forward():
                await self.writer.drain()
                continue
            # Announce sleep, then look once more: a producer that published just before
            # the flag was set did not signal us.
            if all([ring.prepare_sleep() for ring in self.egress.values()]):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), HEARTBEAT_S)
            for ring in self.egress.values():
                ring.wake()

    def _forward(self) -> int:
        """Write every frame waiting in the egress rings; how many."""
        moved = 0
        shift = -time.perf_counter()  # PeerReq.sent_at leaves as minus its age
        for (src, dst), ring in self.egress.items():
            for frame in ring.get_all(BATCH):
                self._write(envelope.header(Kind.FRAME, src, dst), restamp(frame, shift))
                moved += 1
        if moved:
            self.frames_out += moved
            self._send_counters()
        return moved

    def _write(self, head: bytes, body: bytes = b"") -> None:
        n = len(head) + len(body)
        self.writer.write(n.to_bytes(_LEN_BYTES, "little") + head)
        if body:
            self.writer.write(body)

    def _send(self, env: Envelope) -> None:
        self._write(envelope.encode(env))

    def _send_counters(self) -> None:
        if self.counters is None or not self.own:
            return
        now = self.counters.read(self.own)
        if now != self.sent_counters:
            self._send(envelope.counters(now))
            self.sent_counters = now

    async def _heartbeat(self) -> None:
        while True:
            self._send(envelope.ping(Kind.PING, time.perf_counter()))
            self._send_counters()
            await self.writer.drain()
            await asyncio.sleep(HEARTBEAT_S)

    # -- stream -> rings ----------------------------------------------------------------
    async def _inbound(self) -> None:
        while True:
            try:
                raw = await asyncio.wait_for(read_frame(self.reader, MAX_FRAME), DEAD_AFTER_S)
            except TimeoutError:
                raise ConnectionError(f"nothing heard for {DEAD_AFTER_S:g} s") from None
            env = envelope.decode(raw)
            if env.kind is Kind.FRAME:
                await self._deliver(env)
            elif env.kind is Kind.PING:
                self._send(Envelope(Kind.PONG, body=env.body))
            elif env.kind is Kind.PONG:
                sample = time.perf_counter() - envelope.clock(env)
                self.rtt = sample if self.rtt == 0 else 0.875 * self.rtt + 0.125 * sample
            else:
                self._mirror(envelope.slots(env))

    async def _deliver(self, env: Envelope) -> None:
        ring = self.ingress.get((env.src, env.dst))
        if ring is None:
            raise EnvelopeError(f"a frame from node {env.src} to node {env.dst}: not an edge "
                                f"this link carries ({sorted(self.ingress)})")  # fmt: skip
        # The age the frame had when it left, plus half a round trip on the wire.
        frame = restamp(env.body, time.perf_counter() - self.rtt / 2)
        wait = _PUT_WAIT_MIN
        while not ring.try_put(frame):
            await asyncio.sleep(wait)  # the ring is full: stop reading, TCP pushes back
            wait = min(2 * wait, _PUT_WAIT_MAX)
        self.frames_in += 1

    def _mirror(self, values: dict[int, int]) -> None:
        if self.counters is None:
            return
        foreign = set(values) - self.theirs
        if foreign:
            raise EnvelopeError(f"COUNTERS for slots {sorted(foreign)} the peer does not own")
        self.counters.write(values)


def _reason(task: asyncio.Task[None]) -> str:
    exc = task.exception()
    if exc is None:
        return "the link stopped"
    if isinstance(exc, EOFError):
        return "the peer closed the connection"
    if isinstance(exc, ProtocolError):
        return f"malformed frame from the peer: {exc}"
    if isinstance(exc, RingClosed):
        return f"ring {exc} is closed: its consumer is gone"
    if isinstance(exc, OSError | ConnectionError):
        return f"connection lost: {exc or type(exc).__name__}"
    return f"{type(exc).__name__}: {exc}"
