"""The daemon's stand-in for a remote engine: a process on the daemon's host.

The engine group starts it where it would start the engine, with the rings the engine
would get, so nothing else on this host knows the engine is elsewhere:

    connect (retrying with backoff while the remote host is down or restarting)
      -> handshake + model card checks -> READY into the front end's ring
      -> bridge the rings to the connection until it fails -> exit EXIT_LINK_LOST

The group reads that exit as "remote engine 'large' at HOST:PORT: connection lost",
fails the requests in flight and the keeper starts the group again, which starts a new
link. A refusal (wrong token or version, another model, a card that fails its checks)
is a configuration error: READY carries it and the link ends without retrying.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import sys

import uvloop

from trd.engines.boot import die_with_parent
from trd.ipc.counters import Counters
from trd.ipc.mesh import Endpoint
from trd.ipc.names import FRONTEND
from trd.protocol import Control, Ready, encode
from trd.remote import envelope, handshake
from trd.remote.bridge import Bridge
from trd.remote.card import CardError, check_card
from trd.remote.envelope import Envelope, Kind
from trd.remote.handshake import HANDSHAKE_S, HandshakeError, Refused
from trd.remote.spec import RemoteSpec
from trd.remote.tcp import write_frame

log = logging.getLogger("trd.link")

EXIT_LINK_LOST = 3
RETRY_MIN_S, RETRY_MAX_S = 0.2, 2.0

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def link_process(
    parent_pid: int, spec: RemoteSpec, endpoint: Endpoint, counters: Counters | None
) -> None:
    """multiprocessing target: the link of one remote engine."""
    die_with_parent(parent_pid)
    # The tag makes the daemon's log tap file these lines under the engine's name.
    logging.basicConfig(level=logging.INFO,
                        format=f"%(levelname)s engine[{spec.name}] link: %(message)s")  # fmt: skip
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when we stop
    code = uvloop.run(Link(spec, endpoint, counters).run())
    endpoint.close()
    sys.exit(code)


class Link:
    def __init__(self, spec: RemoteSpec, endpoint: Endpoint, counters: Counters | None) -> None:
        self.spec, self.endpoint, self.counters = spec, endpoint, counters

    async def run(self) -> int:
        try:
            (reader, writer), ready = await self._connect()
        except (HandshakeError, CardError) as exc:
            error = f"it refused the connection: {exc}" if isinstance(exc, Refused) else str(exc)
            log.error("%s: %s", self.spec.describe(), error)
            self._ready(Ready(self.spec.index, 0, 0, 0, error=error))
            return 0
        self._ready(ready)
        await self._send_thresholds(writer)
        log.info("connected to %s: pid %d, %d KV pages", self.spec.describe(), ready.pid,
                 ready.kv_pages)  # fmt: skip
        index = self.spec.index
        bridge = Bridge(
            reader, writer,
            egress={(src, index): ring for src, ring in self.endpoint.inbound.items()},
            ingress={(index, dst): ring for dst, ring in self.endpoint.outbound.items()},
            counters=self.counters,
            own_slots=self._own_slots(),
        )  # fmt: skip
        reason = await bridge.run()
        log.error("%s: connection lost: %s", self.spec.describe(), reason)
        return EXIT_LINK_LOST

    async def _send_thresholds(self, writer: asyncio.StreamWriter) -> None:
        """The daemon's thresholds rule the remote engine too, those set live included."""
        body = {"op": "set_thresholds", "thresholds": list(self.spec.thresholds),
                "max_wait_ms": self.spec.batching.max_wait_ms}  # fmt: skip
        frame = encode(Control(json.dumps(body)))
        await write_frame(writer, envelope.encode(Envelope(Kind.FRAME, FRONTEND, self.spec.index,
                                                           frame)))  # fmt: skip

    def _own_slots(self) -> list[int]:
        """Every counter slot but the remote engine's, which its host mirrors to us."""
        if self.counters is None:
            return []
        theirs = set(self.counters.engine_slots(self.spec.index))
        return [s for s in range(self.counters.num_slots) if s not in theirs]

    def _ready(self, msg: Ready) -> None:
        self.endpoint.outbound[FRONTEND].put(encode(msg), timeout=10.0)

    async def _connect(self) -> tuple[Streams, Ready]:
        """Try until the remote engine answers and accepts us; backoff between tries."""
        addr, delay, last = self.spec.address, RETRY_MIN_S, ""
        while True:
            try:
                streams = await asyncio.wait_for(
                    asyncio.open_connection(addr.host, addr.port), HANDSHAKE_S
                )
            except (OSError, TimeoutError) as exc:
                last = self._retrying(f"cannot connect: {exc or 'timed out'}", last, delay)
            else:
                reader, writer = streams
                try:
                    card = await asyncio.wait_for(
                        handshake.connect(reader, writer, self.spec.token, self.spec.name),
                        HANDSHAKE_S,
                    )
                    ready = check_card(card, self.spec)
                except (HandshakeError, CardError):
                    writer.close()
                    raise
                except (OSError, TimeoutError) as exc:  # it may be restarting
                    writer.close()
                    last = self._retrying(f"handshake failed: {exc or 'timed out'}", last, delay)
                else:
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    return streams, ready
            await asyncio.sleep(delay)
            delay = min(2 * delay, RETRY_MAX_S)

    def _retrying(self, problem: str, last: str, delay: float) -> str:
        if problem != last:  # one line per new problem, not one per try
            log.warning("%s: %s; retrying (backoff %.1f s, at most %.0f s)",
                        self.spec.describe(), problem, delay, RETRY_MAX_S)  # fmt: skip
        return problem
