"""Refused requests (a missing or wrong API key) in the log: once per client per interval.

A client that retries with a bad key hundreds of times a second must not fill the log:
its first refusal is logged at once, the next ones are counted, and the first refusal
after EVERY_S logs one line with that count. The table of clients is bounded: when
MAX_CLIENTS were each logged less than EVERY_S ago, refusals of further clients are
counted together and logged as one line per interval, so neither memory nor the log
grows with the number of addresses an attacker uses.

    WARNING trd.auth refused client=10.0.0.7 reason="wrong key" request="POST /v1/chat/..."
            refused_since_last_line=412
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from trd.logs import kv

log = logging.getLogger("trd.auth")

EVERY_S = 60.0
MAX_CLIENTS = 1024
OTHERS = "(other clients)"


class RefusalLog:
    def __init__(
        self,
        every_s: float = EVERY_S,
        max_clients: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_s, self.max_clients, self.clock = every_s, max_clients, clock
        # client -> (when its last line was logged, refusals since); oldest line first
        self.clients: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self.others: tuple[float, int] = (-float("inf"), 0)

    def refused(self, client: str, reason: str, method: str, path: str) -> None:
        now = self.clock()
        self._forget(now)
        if client not in self.clients and len(self.clients) >= self.max_clients:
            logged, count = self.others
            if now - logged < self.every_s:
                self.others = (logged, count + 1)
                return
            self.others = (now, 0)
            self._log(OTHERS, reason, method, path, count)
            return
        logged, count = self.clients.get(client, (-float("inf"), 0))
        if now - logged < self.every_s:
            self.clients[client] = (logged, count + 1)
            return
        self.clients[client] = (now, 0)
        self.clients.move_to_end(client)
        self._log(client, reason, method, path, count)

    def _forget(self, now: float) -> None:
        """Drop clients whose line is older than the interval (their next one logs anyway),
        logging what they were refused since."""
        while self.clients:
            client, (logged, count) = next(iter(self.clients.items()))
            if now - logged < self.every_s:
                return
            del self.clients[client]
            if count:
                log.warning("refused %s", kv(client=client, refused_since_last_line=count))

    def _log(self, client: str, reason: str, method: str, path: str, before: int) -> None:
        # The path is the client's text: kv quotes it; long ones are cut.
        log.warning("refused %s", kv(client=client, reason=reason,
                                     request=f"{method} {path[:100]}",
                                     refused_since_last_line=before))  # fmt: skip
