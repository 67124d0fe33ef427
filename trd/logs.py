"""Structured one-line logs on stderr, and a tap that keeps each engine's last lines.

A line is `<ts> <LEVEL> <logger> <message>`; under journald ($JOURNAL_STREAM set) it is
`<priority><logger> <message>` instead, since journald stamps time itself and reads the
`<N>` prefix as the syslog priority. Per-request lines carry `key=value` fields (`kv`).

Engine processes inherit our stderr. `StderrTap` puts a pipe in its place and copies
every line through, remembering the recent ones; when an engine fails to start, its
last lines go into the error that names it.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections import deque
from multiprocessing import resource_tracker
from typing import NoReturn

# syslog priorities for the journald prefix.
_PRIORITY = {"DEBUG": 7, "INFO": 6, "WARNING": 4, "ERROR": 3, "CRITICAL": 2}
# The engine processes' log format is "<LEVEL> engine[<name>] <message>".
_ENGINE_TAG = re.compile(r"engine\[([^\]]+)\]")


def kv(**fields: object) -> str:
    """`a=1 b=x` with values that contain spaces or quotes written as JSON-ish strings."""
    parts = []
    for k, v in fields.items():
        s = str(v)
        if not s or any(c in s for c in ' "='):
            s = '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
        parts.append(f"{k}={s}")
    return " ".join(parts)


class _Formatter(logging.Formatter):
    def __init__(self, journald: bool) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")
        self.journald = journald

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record) if not self.journald else self._journald(record)
        return line.replace("\n", " | ")  # one record, one line

    def _journald(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        if record.exc_info:
            msg += " " + self.formatException(record.exc_info)
        return f"<{_PRIORITY.get(record.levelname, 6)}>{record.name} {msg}"


def setup_logging(level: str = "INFO", stream: object = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(_Formatter(journald=bool(os.environ.get("JOURNAL_STREAM"))))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiohttp's access log would add a second line per request; ours carries more.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def exit_now(code: int) -> NoReturn:
    """Flush the logs and exit without the interpreter's teardown (torch's modules: about a
    second on 2 cores), for a process that has closed everything of its own: a stopped
    engine, the stopped daemon. atexit handlers and finalizers do not run."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class StderrTap:
    """Route fd 2 through a pipe; every line still reaches the original stderr."""

    def __init__(self, keep: int = 200) -> None:
        # multiprocessing's resource tracker (started with the first shared-memory ring)
        # lives until we exit: started after the pipe took fd 2, it would hold the pipe
        # open and every close() would wait its whole timeout. Started now, it keeps the
        # real stderr (its leak warnings still reach the journal).
        resource_tracker.ensure_running()
        self.out_fd = os.dup(2)
        self.recent: deque[str] = deque(maxlen=keep)
        self._lock = threading.Lock()
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._copier = threading.Thread(
            target=self._copy, args=(read_fd,), name="stderr-tap", daemon=True
        )
        self._copier.start()

    def close(self, timeout_s: float = 2.0) -> None:
        """Put the original stderr back on fd 2 and wait until the lines written so far have
        reached it: a process that exits right after printing (a config error) keeps its
        message. Waits at most `timeout_s` while a child still holds the pipe."""
        sys.stderr.flush()
        os.dup2(self.out_fd, 2)  # the pipe's last writer here goes: the copier reads to EOF
        self._copier.join(timeout_s)

    def stream(self) -> object:
        """A text stream to the original stderr, for our own log handler."""
        return os.fdopen(os.dup(self.out_fd), "w", buffering=1)

    def _copy(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for raw in pipe:
                view = memoryview(raw)
                while view:
                    view = view[os.write(self.out_fd, view) :]
                with self._lock:
                    self.recent.append(raw.decode(errors="replace").rstrip())

    def last_lines(self, engine: str, count: int = 30) -> list[str]:
        """The last lines of `engine`: its tagged lines and the untagged ones (tracebacks)
        that follow them; our own log lines do not pass through the tap."""
        with self._lock:
            lines = list(self.recent)
        mine, owner = [], None
        for line in lines:
            tag = _ENGINE_TAG.search(line)
            owner = tag.group(1) if tag else owner
            if owner == engine:
                mine.append(line)
        return mine[-count:]
