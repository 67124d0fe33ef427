"""systemd's notify protocol: datagrams like b"READY=1\\nSTATUS=serving" to $NOTIFY_SOCKET.

The socket is a unix datagram socket; a path starting with '@' is in the abstract
namespace (the '@' stands for a leading NUL byte). Without $NOTIFY_SOCKET (not run by
systemd, or Type= is not notify) every call does nothing. With $WATCHDOG_USEC set,
systemd kills the unit unless it hears WATCHDOG=1 within that interval; `watchdog_s`
is the period to ping at, half the interval as sd_watchdog_enabled(3) advises.

Outside systemd, a process that serves says the same with a ready file
(`write_ready_file`): benchmarks and tests that start it with port 0 read the ports
it bound there.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        path = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + path[1:] if path.startswith("@") else path
        self.watchdog_s: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        # WATCHDOG_PID names the process the watchdog is meant for; another one ignores it.
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 2e6

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def notify(self, **fields: str | int) -> bool:
        """Send `KEY=value` lines (e.g. READY=1, STATUS="..."); False if nothing was sent."""
        if not self.address:
            return False
        payload = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(self.address)
                sock.sendall(payload)
        except OSError as exc:
            # A lost notification must not take the daemon down; systemd times out instead.
            log.warning("sd_notify to %r failed: %s", self.address, exc)
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify(READY=1, STATUS=status)

    def status(self, status: str) -> bool:
        return self.notify(STATUS=status)

    def stopping(self, status: str) -> bool:
        return self.notify(STOPPING=1, STATUS=status)

    def watchdog(self) -> bool:
        return self.notify(WATCHDOG=1)


def write_ready_file(path: Path, **fields: Any) -> None:
    """The `--ready-file` of a process that serves: a JSON object of `fields` (its pid and
    the addresses it bound, ports included when it asked for port 0), written whole (a
    temporary file renamed), so whoever waits for it never reads half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **fields}))
    os.replace(tmp, path)
