"""A non-blocking Linux eventfd that a consumer sleeps on and a producer signals.

An `EventFd` can be handed to a process made by the "spawn" start method: pickling it
while the child is being spawned registers the descriptor to be passed to the child.
"""

from __future__ import annotations

import contextlib
import os
from multiprocessing.reduction import DupFd
from typing import Any


class EventFd:
    """An eventfd counter: `signal` adds one, `drain` resets it to zero."""

    __slots__ = ("_fd",)

    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    @classmethod
    def _adopt(cls, fd: int) -> EventFd:
        efd = cls.__new__(cls)
        efd._fd = fd
        return efd

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("EventFd is closed")
        return self._fd

    def signal(self) -> None:
        os.eventfd_write(self.fileno(), 1)

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.fileno())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __reduce__(self) -> tuple[Any, ...]:
        return _rebuild, (DupFd(self.fileno()),)

    def __repr__(self) -> str:
        return f"EventFd(fd={self._fd})"


def _rebuild(dup: Any) -> EventFd:
    fd = dup.detach()
    # The descriptor arrives inheritable; keep it out of whatever this process execs.
    os.set_inheritable(fd, False)
    return EventFd._adopt(fd)
