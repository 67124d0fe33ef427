"""Ring semantics within one process: order, wrap-around, back-pressure, wake-ups."""

from __future__ import annotations

import os
import random
import select
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trd.ipc.eventfd import EventFd
from trd.ipc.names import SHM_DIR, cleanup_stale, instance_prefix, ring_name
from trd.ipc.ring import Ring, RingClosed

MakeRing = Callable[[int], Ring]


@pytest.fixture
def make_ring() -> Iterator[MakeRing]:
    rings: list[Ring] = []
    efds: list[EventFd] = []

    def make(capacity: int) -> Ring:
        efds.append(EventFd())
        rings.append(Ring.create(f"trd-test-{uuid.uuid4().hex[:12]}", capacity, efds[-1]))
        return rings[-1]

    yield make
    for ring in rings:
        ring.unlink()
        ring.close()
    for efd in efds:
        efd.close()


def readable(efd: EventFd) -> bool:
    return bool(select.select([efd], [], [], 0)[0])


def test_fifo_order_through_an_attached_view(make_ring: MakeRing) -> None:
    producer = make_ring(1024)
    consumer = Ring.attach(producer.name, producer.wakeup)
    frames = [bytes([i]) * i for i in range(40)]
    for frame in frames:
        assert producer.try_put(frame)
    assert consumer.get_all(max_frames=3) == frames[:3]
    assert consumer.get_all() == frames[3:]
    assert consumer.get() is None
    consumer.close()


def test_wraps_around_at_every_offset(make_ring: MakeRing) -> None:
    ring = make_ring(61)  # prime, so frame starts drift over every offset
    starts: set[int] = set()
    sent: list[bytes] = []
    got: list[bytes] = []
    written = 0
    rng = random.Random(0)
    for _ in range(400):
        while True:
            frame = rng.randbytes(rng.randrange(58))
            if not ring.try_put(frame):
                break
            starts.add(written % 61)
            written += 4 + len(frame)
            sent.append(frame)
        got.extend(ring.get_all(max_frames=2))
    got.extend(ring.get_all())
    assert starts == set(range(61))
    assert got == sent


def test_full_ring_refuses_then_accepts_after_a_get(make_ring: MakeRing) -> None:
    ring = make_ring(64)
    assert ring.try_put(bytes(30))  # 34 bytes used
    assert ring.try_put(bytes(26))  # 64 bytes used: exactly full
    assert not ring.try_put(b"")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        ring.put(b"x", timeout=0.05)
    assert 0.05 <= time.monotonic() - t0 < 1.0
    assert ring.get() == bytes(30)
    assert ring.try_put(bytes(30))
    assert not ring.try_put(b"")


def test_frame_larger_than_capacity_minus_prefix_is_refused_at_once(
    make_ring: MakeRing,
) -> None:
    ring = make_ring(64)
    with pytest.raises(ValueError, match="exceeds ring capacity"):
        ring.put(bytes(61))
    ring.put(bytes(60), timeout=0)
    assert ring.get() == bytes(60)


def test_put_waits_for_the_consumer(make_ring: MakeRing) -> None:
    ring = make_ring(64)
    ring.put(bytes(60))
    consumer = threading.Timer(0.05, ring.get)
    consumer.start()
    t0 = time.monotonic()
    ring.put(b"second", timeout=5)
    assert time.monotonic() - t0 >= 0.04
    consumer.join()
    assert ring.get_all() == [b"second"]


def test_closed_ring_refuses_puts_keeps_frames_and_wakes_consumer(
    make_ring: MakeRing,
) -> None:
    ring = make_ring(64)
    ring.put(b"last")
    assert not ring.closed and not readable(ring.wakeup)
    ring.mark_closed()
    assert ring.closed and readable(ring.wakeup)
    with pytest.raises(RingClosed):
        ring.try_put(b"more")
    assert ring.get() == b"last"


def test_closing_unblocks_a_waiting_producer(make_ring: MakeRing) -> None:
    ring = make_ring(64)
    ring.put(bytes(60))
    threading.Timer(0.05, ring.mark_closed).start()
    with pytest.raises(RingClosed):
        ring.put(b"x", timeout=5)


def test_producer_signals_only_a_sleeping_consumer(make_ring: MakeRing) -> None:
    ring = make_ring(256)
    ring.put(b"a")  # consumer busy: no syscall, fd stays quiet
    assert not readable(ring.wakeup)
    assert not ring.prepare_sleep()  # a frame is waiting: do not block
    ring.wake()
    assert ring.get_all() == [b"a"]
    assert ring.prepare_sleep()  # empty: may block
    assert not readable(ring.wakeup)
    ring.put(b"b")
    assert readable(ring.wakeup)
    ring.wake()
    assert not readable(ring.wakeup)
    ring.put(b"c")
    assert not readable(ring.wakeup)
    assert ring.get_all() == [b"b", b"c"]


def test_readable_peeks_without_consuming_or_signalling(make_ring: MakeRing) -> None:
    producer = make_ring(256)
    consumer = Ring.attach(producer.name, producer.wakeup)
    assert not consumer.readable()
    producer.put(b"x")
    assert consumer.readable() and consumer.readable()
    assert not readable(producer.wakeup)  # the consumer never announced sleep
    assert consumer.get() == b"x"
    assert not consumer.readable()
    consumer.close()


def test_only_the_creator_unlinks(make_ring: MakeRing) -> None:
    ring = make_ring(64)
    attached = Ring.attach(ring.name, ring.wakeup)
    with pytest.raises(RuntimeError, match="only its creator"):
        attached.unlink()
    attached.close()
    attached.close()
    assert os.path.exists(os.path.join(SHM_DIR, ring.name))


def test_unlink_removes_the_segment() -> None:
    efd = EventFd()
    ring = Ring.create(f"trd-test-{uuid.uuid4().hex[:12]}", 64, efd)
    path = os.path.join(SHM_DIR, ring.name)
    assert os.path.exists(path)
    ring.unlink()
    ring.unlink()
    assert not os.path.exists(path)
    ring.close()
    efd.close()


def test_names() -> None:
    prefix = instance_prefix(123, "ab12")
    assert prefix == "trd-123-ab12-"
    assert ring_name(prefix, -1, 0) == "trd-123-ab12-fe-e0"
    assert ring_name(prefix, 3, -1) == "trd-123-ab12-e3-fe"
    assert ring_name(prefix, 1, 2) == "trd-123-ab12-e1-e2"
    with pytest.raises(ValueError, match="alphanumeric"):
        instance_prefix(1, "a/b")


def test_cleanup_stale_removes_only_dead_instances(tmp_path: Path) -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    dead = child.pid
    names = [f"trd-{dead}-x1-fe-e0", f"trd-{os.getpid()}-x2-fe-e0", "trd-abc-x", "other"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert cleanup_stale(str(tmp_path)) == [names[0]]
    assert sorted(os.listdir(tmp_path)) == sorted(names[1:])
