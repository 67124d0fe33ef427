"""All rings of one daemon instance, and the per-process view of them.

Nodes are the front end (`FRONTEND`) and engines 0..E-1. Every ordered pair of
distinct nodes gets one ring, since every pair talks:

    frontend -> engine i   Submit, Abort, Control
    engine i -> frontend   Ready, Emit, Done, Stats
    engine i -> engine j   PeerReq

Each node owns one eventfd shared by all of its inbound rings, so an idle node
blocks on a single descriptor whichever peer writes to it.

The host of a remote engine (trd/remote/host.py) creates only the rings of the edges
that touch its engine (`only=`): the other nodes live on the daemon's host, and a
bridge stands in for them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import TracebackType

from trd.ipc.eventfd import EventFd
from trd.ipc.names import FRONTEND, ring_name
from trd.ipc.ring import Ring

DEFAULT_CAPACITY = 4 << 20


@dataclass(slots=True)
class Endpoint:
    """One node's rings; picklable, to hand to a spawned engine process."""

    node: int
    inbound: dict[int, Ring]  # src node -> ring this node consumes
    outbound: dict[int, Ring]  # dst node -> ring this node produces into
    wakeup: EventFd  # shared by every inbound ring

    def prepare_sleep(self) -> bool:
        """`Ring.prepare_sleep` on every inbound ring; True iff all are still empty.

        After True, block until `wakeup` is readable, then call `wake()`; after False
        the flags are already cleared.
        """
        # A list, not a generator: every ring's flag must be set before blocking.
        empty = all([ring.prepare_sleep() for ring in self.inbound.values()])
        if not empty:
            self.wake()
        return empty

    def readable(self) -> bool:
        return any(ring.readable() for ring in self.inbound.values())

    def wake(self) -> None:
        for ring in self.inbound.values():
            ring.wake()

    def close(self) -> None:
        """Unmap the rings and close the eventfds this process received."""
        for ring in (*self.inbound.values(), *self.outbound.values()):
            ring.close()
            ring.wakeup.close()


class Mesh:
    """Creates (and owns) every ring and eventfd; `unlink_all` on every exit path."""

    def __init__(
        self,
        prefix: str,
        n_engines: int,
        capacity: int = DEFAULT_CAPACITY,
        only: int | None = None,
    ) -> None:
        if not 1 <= n_engines <= 256:
            raise ValueError(f"n_engines must be in [1, 256], got {n_engines}")
        self.nodes = [FRONTEND, *range(n_engines)]
        self.wakeups: dict[int, EventFd] = {}
        self.rings: dict[tuple[int, int], Ring] = {}
        try:
            for node in self.nodes:
                self.wakeups[node] = EventFd()
            for src in self.nodes:
                for dst in self.nodes:
                    if src != dst and only in (None, src, dst):
                        name = ring_name(prefix, src, dst)
                        self.rings[src, dst] = Ring.create(name, capacity, self.wakeups[dst])
        except BaseException:
            self.unlink_all()
            raise

    def endpoint(self, node: int) -> Endpoint:
        return Endpoint(
            node,
            inbound={src: r for (src, dst), r in self.rings.items() if dst == node},
            outbound={dst: r for (src, dst), r in self.rings.items() if src == node},
            wakeup=self.wakeups[node],
        )

    def unlink_all(self) -> None:
        """Unlink and unmap every ring and close every eventfd; safe to call repeatedly."""
        for ring in self.rings.values():
            # Finish the sweep even if a segment vanished already.
            with contextlib.suppress(FileNotFoundError):
                ring.unlink()
            ring.close()
        for efd in self.wakeups.values():
            efd.close()

    def __enter__(self) -> Mesh:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.unlink_all()
