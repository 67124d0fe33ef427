"""Single-producer single-consumer byte ring in POSIX shared memory.

Segment layout (each control word on its own 64-byte cache line, so the producer's
and the consumer's stores do not contend for a line):

    byte 0     head      u64  bytes consumed so far (written by the consumer only)
    byte 64    tail      u64  bytes produced so far (written by the producer only)
    byte 128   sleeping  u64  1 while the consumer is (about to be) blocked on its eventfd
    byte 192   closed    u64  1 once either side called mark_closed()
    byte 256   capacity  u64  size of the data area, fixed at creation
    byte 320   data      u8[capacity]

Frames are a u32 little-endian length followed by the payload; both may wrap around
the end of the data area. Counters only grow, and position = counter % capacity. The
producer writes the frame before publishing tail, the consumer reads it before
publishing head, so each side only ever sees completed frames or free space.

Wake-ups: the consumer sets `sleeping` and re-checks tail before it blocks
(`prepare_sleep`); the producer publishes tail and then reads `sleeping`. Each side
stores and then loads a different word, which x86 may reorder through its store
buffer, so a fence separates them; without it both sides could miss each other and
the consumer would sleep on a non-empty ring.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from multiprocessing.shared_memory import SharedMemory
from typing import Any

from trd.ipc.eventfd import EventFd
from trd.ipc.names import SHM_DIR

_HEAD, _TAIL, _SLEEPING, _CLOSED, _CAPACITY = 0, 8, 16, 24, 32  # indices of u64 words
_HEADER = 320
_LEN = struct.Struct("<I")
_SPINS = 64
_MIN_WAIT, _MAX_WAIT = 50e-6, 1e-3
# A lock round trip is a locked read-modify-write: a full memory fence on x86-64.
_FENCE = threading.Lock()


class RingClosed(Exception):
    """The ring was marked closed; no more frames may be put."""


class Ring:
    """One direction of one edge: exactly one producer process, one consumer process."""

    def __init__(
        self, name: str, mm: mmap.mmap, wakeup: EventFd, shm: SharedMemory | None = None
    ) -> None:
        self.name = name
        self.wakeup = wakeup  # the consumer's eventfd
        self._mm: mmap.mmap | None = mm
        self._shm = shm  # set only in the creating process, which alone unlinks
        self._buf = memoryview(mm)
        self._ctl = self._buf[:_HEADER].cast("Q")
        self.capacity: int = self._ctl[_CAPACITY]
        self._data = self._buf[_HEADER : _HEADER + self.capacity]
        # Each side owns one counter and caches the other's, re-reading it only when
        # the cached value says the ring is full (producer) or empty (consumer).
        self._tail = self._tail_seen = self._ctl[_TAIL]
        self._head = self._head_seen = self._ctl[_HEAD]
        self._unlinked = False

    @classmethod
    def create(cls, name: str, capacity: int, wakeup: EventFd) -> Ring:
        """Create the segment (fails if the name exists); this process owns and unlinks it."""
        if capacity < 8:
            raise ValueError(f"ring capacity must be >= 8 bytes, got {capacity}")
        # SharedMemory creates the segment exclusively and registers it with the
        # resource tracker, which unlinks it should this process die without doing so.
        shm = SharedMemory(name, create=True, size=_HEADER + capacity)
        shm.close()
        try:
            mm = map_segment(name)
        except OSError:
            shm.unlink()
            raise
        struct.pack_into("=Q", mm, 8 * _CAPACITY, capacity)
        return cls(name, mm, wakeup, shm)

    @classmethod
    def attach(cls, name: str, wakeup: EventFd) -> Ring:
        """Map a segment created by another Ring."""
        return cls(name, map_segment(name), wakeup)

    def __reduce__(self) -> tuple[Any, ...]:
        return Ring.attach, (self.name, self.wakeup)

    def __repr__(self) -> str:
        return f"Ring({self.name!r}, capacity={self.capacity})"

    # -- producer ---------------------------------------------------------------

    def try_put(self, frame: bytes | bytearray | memoryview) -> bool:
        """Append one frame if it fits now; False when the ring is too full."""
        n = len(frame)
        if n > self.capacity - _LEN.size:
            raise ValueError(f"frame of {n} bytes exceeds ring capacity {self.capacity} - 4")
        if self._ctl[_CLOSED]:
            raise RingClosed(self.name)
        end = self._tail + _LEN.size + n
        if end - self._head_seen > self.capacity:
            self._head_seen = self._ctl[_HEAD]
            if end - self._head_seen > self.capacity:
                return False
        self._copy_in(self._tail, _LEN.pack(n))
        self._copy_in(self._tail + _LEN.size, frame)
        self._tail = end
        self._ctl[_TAIL] = end
        with _FENCE:
            pass
        if self._ctl[_SLEEPING]:
            self.wakeup.signal()
        return True

    def put(self, frame: bytes | bytearray | memoryview, timeout: float | None = None) -> None:
        """Append one frame, waiting for room; TimeoutError after `timeout` seconds."""
        for _ in range(_SPINS):
            if self.try_put(frame):
                return
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = _MIN_WAIT
        while not self.try_put(frame):
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"ring {self.name} full for {timeout} s")
                wait = min(wait, left)
            time.sleep(wait)
            wait = min(2 * wait, _MAX_WAIT)

    def _copy_in(self, pos: int, src: bytes | bytearray | memoryview) -> None:
        off = pos % self.capacity
        first = min(len(src), self.capacity - off)
        self._data[off : off + first] = src[:first]
        if first < len(src):
            self._data[: len(src) - first] = src[first:]

    # -- consumer ---------------------------------------------------------------

    def get(self) -> bytes | None:
        """Pop the oldest frame, or None when the ring is empty."""
        if self._head == self._tail_seen:
            self._tail_seen = self._ctl[_TAIL]
            if self._head == self._tail_seen:
                return None
        (n,) = _LEN.unpack(self._copy_out(self._head, _LEN.size))
        frame = self._copy_out(self._head + _LEN.size, n)
        self._head += _LEN.size + n
        self._ctl[_HEAD] = self._head
        return frame

    def get_all(self, max_frames: int | None = None) -> list[bytes]:
        """Pop every frame available now (at most `max_frames`), oldest first."""
        frames: list[bytes] = []
        while max_frames is None or len(frames) < max_frames:
            frame = self.get()
            if frame is None:
                break
            frames.append(frame)
        return frames

    def _copy_out(self, pos: int, n: int) -> bytes:
        off = pos % self.capacity
        if off + n <= self.capacity:
            return bytes(self._data[off : off + n])
        return bytes(self._data[off:]) + bytes(self._data[: off + n - self.capacity])

    def readable(self) -> bool:
        """True when a frame is waiting (a cheap check for spinning consumers)."""
        return self._head != self._ctl[_TAIL]

    def prepare_sleep(self) -> bool:
        """Announce that the consumer is about to block; True iff the ring is still empty.

        After True, block until `wakeup` is readable, then call `wake()`. After False,
        call `wake()` and consume.
        """
        self._ctl[_SLEEPING] = 1
        with _FENCE:
            pass
        self._tail_seen = self._ctl[_TAIL]
        return self._head == self._tail_seen

    def wake(self) -> None:
        """Clear the sleeping flag and drain the eventfd."""
        self._ctl[_SLEEPING] = 0
        self.wakeup.drain()

    # -- lifecycle --------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return bool(self._ctl[_CLOSED])

    def mark_closed(self) -> None:
        """Refuse further puts (waiting producers raise RingClosed) and wake the consumer."""
        self._ctl[_CLOSED] = 1
        self.wakeup.signal()

    def close(self) -> None:
        """Unmap the segment in this process; the ring object is unusable afterwards."""
        if self._mm is None:
            return
        # Views into the mapping must be released before it can be unmapped.
        for view in (self._ctl, self._data, self._buf):
            view.release()
        self._mm.close()
        self._mm = None

    def unlink(self) -> None:
        """Remove the segment name (creator only); mappings stay valid until closed."""
        if self._shm is None:
            raise RuntimeError(f"ring {self.name} was attached, only its creator unlinks it")
        if not self._unlinked:
            self._unlinked = True
            self._shm.unlink()  # also unregisters it from the resource tracker


def map_segment(name: str) -> mmap.mmap:
    """Map the segment, every page of it resident from now on.

    A page of a ring is otherwise allocated and mapped when the write position first
    reaches it, and with frames of tens of bytes a 4 MiB ring takes hours of tokens to
    wrap: each process's resident size would grow all that while (issue 54). Reading a
    byte of each page allocates and maps them all now."""
    # Not SharedMemory(name): in 3.11 that registers the segment with this process's
    # resource tracker, which may unlink it when this process exits; unregistering
    # afterwards would drop the creator's registration when both share a tracker (a
    # spawned child does). Only the creator's registration may exist.
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        mm = mmap.mmap(fd, 0)
    finally:
        os.close(fd)
    mm[:: mmap.PAGESIZE]  # a byte of every page: the reads are the point
    return mm
