"""Refused requests (a missing or wrong API key) in the log: once per client per interval.

A client that retries with a bad key hundreds of times a second must not fill the log:
its first refusal is logged at once, the next ones are counted, and the first refusal
after EVERY_S logs one line with that count. The table of clients is bounded: when
MAX_CLIENTS were each logged less than EVERY_S ago, refusals of further clients are
counted together and logged as one line per interval, so neither memory nor the log
grows with the number of addresses an attacker uses.

aiohttp logs a request it cannot parse at ERROR, with a traceback that quotes the raw
bytes: a key sent with a stray byte would reach the log. `quiet_unparsable` turns those
records into refusals of the same log, without the bytes.

    WARNING trd.auth refused client=10.0.0.7 reason="wrong key" request="POST /v1/chat/..."
            refused_since_last_line=412
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError

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

    def refused(self, client: str, reason: str, request: str) -> None:
        now = self.clock()
        logged, count = self.clients.get(client, (-float("inf"), 0))
        if now - logged < self.every_s:
            self.clients[client] = (logged, count + 1)
            return
        self.clients.pop(client, None)  # this line carries its count
        self._forget(now)
        if len(self.clients) < self.max_clients:
            self.clients[client] = (now, 0)
            self._log(client, reason, request, count)
            return
        logged, count = self.others
        if now - logged < self.every_s:
            self.others = (logged, count + 1)
            return
        self.others = (now, 0)
        self._log(OTHERS, reason, request, count)

    def _forget(self, now: float) -> None:
        """Drop the clients (oldest line first) whose line is older than the interval:
        their next refusal logs anyway. What they were refused since is logged now."""
        while self.clients:
            client, (logged, count) = next(iter(self.clients.items()))
            if now - logged < self.every_s:
                break
            del self.clients[client]
            if count:
                log.warning("refused %s", kv(client=client, refused_since_last_line=count))
        logged, count = self.others
        if count and now - logged >= self.every_s:
            self.others = (logged, 0)
            log.warning("refused %s", kv(client=OTHERS, refused_since_last_line=count))

    def _log(self, client: str, reason: str, request: str, before: int) -> None:
        # The request line is the client's text: kv quotes it; a long one is cut.
        log.warning("refused %s", kv(client=client, reason=reason, request=request[:100],
                                     refused_since_last_line=before))  # fmt: skip


class _Unparsable(logging.Filter):
    def __init__(self, refusals: RefusalLog) -> None:
        super().__init__()
        self.refusals = refusals

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        # "Error handling request from %s": the client's address is the one argument.
        client = str(record.args[0]) if isinstance(record.args, tuple) and record.args else "?"
        self.refusals.refused(client, f"unparsable HTTP ({type(exc).__name__})", "-")
        return False


def quiet_unparsable(refusals: RefusalLog) -> None:
    """Log aiohttp's unparsable requests as refusals, never with their bytes."""
    logging.getLogger("aiohttp.server").addFilter(_Unparsable(refusals))
