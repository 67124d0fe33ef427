"""Ping-pong latency between two processes over a pair of rings, both sides sleeping.

Each side blocks on its eventfd between messages, so every hop pays the full
wake-up path: put -> eventfd write -> select returns -> wake -> get. One-way
latency is measured from the producer's perf_counter() before put to the
consumer's perf_counter() after get (CLOCK_MONOTONIC, shared by processes).

    .venv/bin/python scripts/bench_ring.py [pings]
"""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import struct
import sys
import time
import uuid

from trd.bench.stats import percentile
from trd.ipc.eventfd import EventFd
from trd.ipc.ring import Ring

_STAMP = struct.Struct("<d")


def recv(ring: Ring) -> bytes:
    """Block (sleeping on the eventfd) until one frame arrives."""
    while True:
        frame = ring.get()
        if frame is not None:
            return frame
        if ring.prepare_sleep():
            select.select([ring.wakeup], [], [])
        ring.wake()


def ponger(ping: Ring, pong: Ring, n: int) -> None:
    lat = []
    for _ in range(n):
        frame = recv(ping)
        lat.append(time.perf_counter() - _STAMP.unpack(frame)[0])
        pong.put(_STAMP.pack(time.perf_counter()))
    pong.put(struct.pack(f"<{n}d", *lat))


def main(n: int) -> None:
    token = uuid.uuid4().hex[:8]
    wake_a, wake_b = EventFd(), EventFd()
    ping = Ring.create(f"trd-{os.getpid()}-{token}-ping", 1 << 16, wake_a)
    pong = Ring.create(f"trd-{os.getpid()}-{token}-pong", 1 << 16, wake_b)
    try:
        child = mp.get_context("spawn").Process(target=ponger, args=(ping, pong, n))
        child.start()
        back, rtt = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            ping.put(_STAMP.pack(t0))
            frame = recv(pong)
            t1 = time.perf_counter()
            back.append(t1 - _STAMP.unpack(frame)[0])
            rtt.append(t1 - t0)
        there = list(struct.unpack(f"<{n}d", recv(pong)))
        child.join()
    finally:
        for ring in (ping, pong):
            ring.unlink()
            ring.close()
            ring.wakeup.close()
    for name, xs in (("one-way ->", there), ("one-way <-", back), ("round trip", rtt)):
        us = [1e6 * x for x in xs]
        print(f"{name:11s} median {percentile(us, 50):7.1f} us   p99 {percentile(us, 99):7.1f} us")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
