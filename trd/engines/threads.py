"""How many CPU threads an engine's next forward gets. Pure Python, no torch.

Engines on one host split its cores (`threads` each). With one request in flight, or
whenever the others have nothing runnable, an engine would leave its peers' cores
idle: a request alternates between models, so only one of them works at a time. Such
a forward runs on `threads_alone` threads instead (measured on 2 cores, SmolLM2-135M:
55 -> 33 ms a decode step at batch 1).

An engine runs wide only when every active request of the daemon is runnable on it
(so no peer can get work before this forward's tokens are routed) and no peer runs
wide; it says so in its counter slot for the forward's length, and an idle peer stops
polling its rings (`spin`) while any peer runs wide, so that no core is taken from it.
Checking only that the peers are idle at the start was 5% slower at 16 concurrent
requests than never widening: a peer idle for a moment got work mid-forward. A new
request arriving during a wide forward, or two engines passing the check in the same
instant, make the cores shared for that one forward. Thread counts change float
rounding in the last bits (float64 oracle tests run with widening on), never the
tokens' order or count.
"""

from __future__ import annotations

from collections.abc import Sequence

from trd.ipc.counters import Counters


class ThreadShare:
    def __init__(
        self,
        index: int,
        threads: int,
        threads_alone: int,
        peers: Sequence[int],
        counters: Counters | None,
    ) -> None:
        self.index, self.narrow = index, threads
        self.wide = max(threads, threads_alone)
        self.peers = tuple(peers)
        self.counters = counters
        self.wide_forwards = 0  # forwards run on `wide` threads, for the stats

    def begin(self, runnable: int) -> int:
        """Before a forward of `runnable` requests (after publishing that count): its threads."""
        c = self.counters
        if c is None or self.wide == self.narrow or c.active > runnable:
            return self.narrow
        if any(c.busy(j) > 0 or c.wide(j) for j in self.peers):
            return self.narrow
        c.set_wide(self.index, True)
        self.wide_forwards += 1
        return self.wide

    def end(self) -> None:
        """After the forward: the cores are the peers' again."""
        if self.counters is not None and self.wide > self.narrow:
            self.counters.set_wide(self.index, False)

    def peer_wide(self) -> bool:
        """A peer's forward is using this engine's cores: do not poll, sleep."""
        c = self.counters
        return c is not None and any(c.wide(j) for j in self.peers)
