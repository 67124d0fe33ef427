"""One-way latency of a frame: a ring, vs a ring + bridge + TCP over a veth pair + bridge
+ ring (a remote engine's path), every consumer sleeping between frames.

    python scripts/bench_link.py [pings]          (root: it makes a network namespace)

Ping-pong as in bench_ring.py (the same pinger and ponger), once over two rings and once
with the ponger in a network namespace behind two bridges (trd/remote/bridge.py on uvloop,
one per side, in processes of their own like the daemon's link and the engine host).
Both ends share this machine's CLOCK_MONOTONIC, so one-way times are exact; frames carry
raw stamps that the bridges pass through untouched.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import uvloop
from bench_ring import _STAMP, ponger, recv

from trd.bench.stats import summary
from trd.ipc.mesh import Mesh
from trd.ipc.names import instance_prefix
from trd.ipc.ring import Ring
from trd.remote.bridge import Bridge, Edge
from trd.testing.netns import NetNs, why_not

PORT = 7071
HERE, FAR = 0, 1  # node ids: the pinger's and the ponger's


def side(far: bool) -> tuple[Mesh, dict[Edge, Ring], dict[Edge, Ring]]:
    """The rings of one side; egress and ingress as its bridge sees them."""
    mesh = Mesh(instance_prefix(os.getpid(), secrets.token_hex(4)), 2, 1 << 16, only=FAR)
    out = (lambda e: e[0] == FAR) if far else (lambda e: e[1] == FAR)
    egress = {e: r for e, r in mesh.rings.items() if out(e)}
    ingress = {e: r for e, r in mesh.rings.items() if not out(e)}
    return mesh, egress, ingress


def bridge_client(host: str, egress: dict[Edge, Ring], ingress: dict[Edge, Ring]) -> None:
    async def run() -> None:
        reader, writer = await asyncio.open_connection(host, PORT)
        await Bridge(reader, writer, egress, ingress).run()

    uvloop.run(run())


def pong_server(host: str, n: int) -> None:
    """In the namespace: the far side's bridge, and the ponger behind it."""
    mesh, egress, ingress = side(far=True)

    async def run() -> None:
        done = asyncio.Event()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await Bridge(reader, writer, egress, ingress).run()
            done.set()

        async with await asyncio.start_server(accept, host, PORT):
            print("listening", flush=True)
            await done.wait()

    child = mp.get_context("spawn").Process(
        target=ponger, args=(mesh.rings[HERE, FAR], mesh.rings[FAR, HERE], n)
    )
    child.start()
    try:
        uvloop.run(run())
    finally:
        child.join(10)
        mesh.unlink_all()


def pings(ping: Ring, pong: Ring, n: int) -> tuple[list[float], list[float]]:
    """(there, back) one-way latencies in seconds: n pings, then the ponger's report."""
    back = []
    for _ in range(n):
        ping.put(_STAMP.pack(time.perf_counter()))
        frame = recv(pong)
        back.append(time.perf_counter() - _STAMP.unpack(frame)[0])
    return [t[0] for t in _STAMP.iter_unpack(recv(pong))], back


def over_rings(n: int) -> tuple[list[float], list[float]]:
    mesh = Mesh(instance_prefix(os.getpid(), secrets.token_hex(4)), 2, 1 << 16)
    try:
        child = mp.get_context("spawn").Process(
            target=ponger, args=(mesh.rings[HERE, FAR], mesh.rings[FAR, HERE], n)
        )
        child.start()
        result = pings(mesh.rings[HERE, FAR], mesh.rings[FAR, HERE], n)
        child.join(10)
        return result
    finally:
        mesh.unlink_all()


def over_link(ns: NetNs, n: int) -> tuple[list[float], list[float]]:
    argv = [sys.executable, __file__, "--pong-server", ns.peer_ip, str(n)]
    path = [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    server = subprocess.Popen(ns.command(argv), stdout=subprocess.PIPE, env=env)
    assert server.stdout is not None and server.stdout.readline().strip() == b"listening"
    mesh, egress, ingress = side(far=False)
    bridge = mp.get_context("spawn").Process(
        target=bridge_client, args=(ns.peer_ip, egress, ingress)
    )
    bridge.start()
    try:
        return pings(mesh.rings[HERE, FAR], mesh.rings[FAR, HERE], n)
    finally:
        bridge.terminate()
        bridge.join(10)
        server.wait(30)
        mesh.unlink_all()


def main() -> int:
    if sys.argv[1:2] == ["--pong-server"]:
        pong_server(sys.argv[2], int(sys.argv[3]))
        return 0
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    reason = why_not()
    if reason is not None:
        print(f"bench_link: needs network namespaces (root): {reason}", file=sys.stderr)
        return 2
    results = {"ring": over_rings(n)}
    with NetNs() as ns:
        results["link"] = over_link(ns, n)
    for name, (there, back) in results.items():
        for way, xs in (("->", there), ("<-", back)):
            s = summary(xs, 1e6)  # microseconds
            print(f"{name:4s} one-way {way}  p50 {s['p50']:7.1f} us   p99 {s['p99']:8.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
