"""Rings, eventfds and the mesh across real processes made by the "spawn" start method,
and engines spawned without re-importing the parent's main module."""

from __future__ import annotations

import asyncio
import importlib.util
import multiprocessing as mp
import os
import random
import select
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

import pytest

from trd.engines.boot import without_main
from trd.engines.loop import spin
from trd.ipc.eventfd import EventFd
from trd.ipc.mesh import Endpoint, Mesh
from trd.ipc.names import FRONTEND, SHM_DIR, instance_prefix
from trd.ipc.ring import Ring
from trd.protocol import Abort, decode, encode

SPAWN = mp.get_context("spawn")
STOP = 2**64 - 1


def frames(n: int, max_size: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [i.to_bytes(4, "little") + rng.randbytes(rng.randrange(max_size)) for i in range(n)]


def produce(ring: Ring, n: int, max_size: int, seed: int) -> None:
    for frame in frames(n, max_size, seed):
        ring.put(frame, timeout=30)
    ring.close()


def signal_three_times(efd: EventFd) -> None:
    for _ in range(3):
        efd.signal()


def forward(ep: Endpoint, other: int) -> None:
    """Engine stand-in: front end -> other engine -> front end; exits after two STOPs."""
    stops = 0
    while stops < 2:
        batch = [(src, f) for src, ring in ep.inbound.items() for f in ring.get_all()]
        if not batch:
            if ep.prepare_sleep():
                assert select.select([ep.wakeup], [], [], 30)[0], "lost wake-up"
                ep.wake()
            continue
        for src, frame in batch:
            ep.outbound[other if src == FRONTEND else FRONTEND].put(frame, timeout=30)
            stops += decode(frame) == Abort(STOP)
    ep.close()


def shm_files(prefix: str) -> list[str]:
    return [name for name in os.listdir(SHM_DIR) if name.startswith(prefix)]


def new_ring(capacity: int) -> tuple[Ring, EventFd]:
    efd = EventFd()
    return Ring.create(f"trd-test-{uuid.uuid4().hex[:12]}", capacity, efd), efd


def test_eventfd_passes_to_a_spawned_child() -> None:
    efd = EventFd()
    child = SPAWN.Process(target=signal_three_times, args=(efd,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert os.eventfd_read(efd.fileno()) == 3
    efd.close()


def test_spawned_producer_with_back_pressure_and_sleeping_consumer() -> None:
    ring, efd = new_ring(2048)
    child = SPAWN.Process(target=produce, args=(ring, 20_000, 600, 1))
    child.start()
    got: list[bytes] = []
    sleeps = 0
    while len(got) < 20_000:
        batch = ring.get_all()
        got.extend(batch)
        if not batch and ring.prepare_sleep():
            sleeps += 1
            assert select.select([efd], [], [], 30)[0], "lost wake-up"
        ring.wake()
    child.join(30)
    assert child.exitcode == 0
    assert got == frames(20_000, 600, 1)
    assert ring.get() is None
    assert sleeps > 0
    ring.unlink()
    ring.close()
    efd.close()
    assert shm_files(ring.name) == []


async def consume_async(ring: Ring, n: int) -> list[bytes]:
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    loop.add_reader(ring.wakeup.fileno(), readable.set)
    got: list[bytes] = []
    while len(got) < n:
        batch = ring.get_all()
        got.extend(batch)
        if not batch and ring.prepare_sleep():
            await asyncio.wait_for(readable.wait(), 30)
        readable.clear()
        ring.wake()
    loop.remove_reader(ring.wakeup.fileno())
    return got


def test_asyncio_consumer_wakes_through_add_reader() -> None:
    ring, efd = new_ring(4096)
    child = SPAWN.Process(target=produce, args=(ring, 3000, 2000, 2))
    child.start()
    got = asyncio.run(consume_async(ring, 3000))
    child.join(30)
    assert child.exitcode == 0
    assert got == frames(3000, 2000, 2)
    ring.unlink()
    ring.close()
    efd.close()


def test_mesh_between_spawned_engines() -> None:
    prefix = instance_prefix(os.getpid(), uuid.uuid4().hex[:8])
    with Mesh(prefix, n_engines=2, capacity=1 << 16) as mesh:
        assert sorted(shm_files(prefix)) == sorted(
            f"{prefix}{a}-{b}" for a, b in [("fe", "e0"), ("fe", "e1"), ("e0", "fe"),
                                            ("e1", "fe"), ("e0", "e1"), ("e1", "e0")]
        )  # fmt: skip
        engines = [SPAWN.Process(target=forward, args=(mesh.endpoint(i), 1 - i)) for i in (0, 1)]
        for engine in engines:
            engine.start()
        fe = mesh.endpoint(FRONTEND)
        sent: dict[int, list[bytes]] = {0: [], 1: []}
        for rid in [*range(300), STOP]:
            for dst in (0, 1):
                frame = encode(Abort(rid if rid == STOP else 2 * rid + dst))
                fe.outbound[dst].put(frame, timeout=30)
                sent[dst].append(frame)
        got: dict[int, list[bytes]] = {0: [], 1: []}
        while True:
            for src, ring in fe.inbound.items():
                got[src].extend(ring.get_all())
            if len(got[0]) + len(got[1]) == 602:
                break
            if fe.prepare_sleep():
                assert select.select([fe.wakeup], [], [], 30)[0], "lost wake-up"
                fe.wake()
        for engine in engines:
            engine.join(30)
            assert engine.exitcode == 0
        # Frames sent to engine 0 come back through engine 1, in order, and vice versa.
        assert got == {0: sent[1], 1: sent[0]}
    assert shm_files(prefix) == []


def test_owner_exit_leaves_no_segments_and_no_tracker_complaints() -> None:
    script = textwrap.dedent(
        """
        import multiprocessing as mp, os, sys
        sys.path.insert(0, os.environ["TESTS_DIR"])
        from test_ipc_process import forward
        from trd.ipc.mesh import Mesh
        from trd.ipc.names import FRONTEND
        from trd.protocol import Abort, encode
        if __name__ == "__main__":
            with Mesh(sys.argv[1], n_engines=2, capacity=4096) as mesh:
                procs = [mp.get_context("spawn").Process(target=forward,
                         args=(mesh.endpoint(i), 1 - i)) for i in (0, 1)]
                for p in procs:
                    p.start()
                for dst in (0, 1):
                    mesh.endpoint(FRONTEND).outbound[dst].put(encode(Abort(2**64 - 1)))
                for p in procs:
                    p.join(30)
                    assert p.exitcode == 0
        """
    )
    prefix = instance_prefix(os.getpid(), uuid.uuid4().hex[:8])
    env = {**os.environ, "TESTS_DIR": os.path.dirname(__file__)}
    run = subprocess.run(
        [sys.executable, "-c", script, prefix], env=env, capture_output=True, text=True, timeout=60
    )
    assert (run.returncode, run.stderr) == (0, "")
    assert shm_files(prefix) == []


def test_spin_returns_when_a_frame_arrives_and_gives_up_after_its_budget() -> None:
    prefix = instance_prefix(os.getpid(), uuid.uuid4().hex[:8])
    with Mesh(prefix, n_engines=1, capacity=1 << 12) as mesh:
        engine = mesh.endpoint(0)
        start = time.perf_counter()
        spin(engine, 0.05, lambda: False)
        assert time.perf_counter() - start >= 0.05
        assert not engine.readable()
        later = threading.Timer(0.02, mesh.endpoint(FRONTEND).outbound[0].put, [b"x"])
        later.start()
        start = time.perf_counter()
        spin(engine, 60.0, lambda: False)
        later.join()
        assert engine.readable()
        assert time.perf_counter() - start < 30.0  # returned for the frame, not the budget
        assert engine.inbound[FRONTEND].get() == b"x"


def test_spin_stops_when_told_to() -> None:
    """An idle engine stops polling as soon as a peer's wide forward wants the core."""
    prefix = instance_prefix(os.getpid(), uuid.uuid4().hex[:8])
    with Mesh(prefix, n_engines=1, capacity=1 << 12) as mesh:
        wanted = threading.Event()
        threading.Timer(0.02, wanted.set).start()
        start = time.perf_counter()
        spin(mesh.endpoint(0), 60.0, wanted.is_set)
        assert wanted.is_set() and time.perf_counter() - start < 30.0


def report_main(queue: mp.Queue[bool]) -> None:
    queue.put(hasattr(sys.modules["__main__"], "dedent"))  # textwrap's code ran as main


def test_engines_spawn_without_the_parents_main_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Started as `python -m trd.daemon`, a child imports the daemon module again unless
    spawned inside without_main (here the parent's main is `-m textwrap`'s, as pytest's own
    may be a __main__.py, which spawn never re-imports)."""
    main = type(sys)("__main__")
    main.__spec__ = importlib.util.find_spec("textwrap")
    monkeypatch.setitem(sys.modules, "__main__", main)
    for bare, imported in ((False, True), (True, False)):
        queue: mp.Queue[bool] = SPAWN.Queue()
        child = SPAWN.Process(target=report_main, args=(queue,))
        with without_main() if bare else nullcontext():
            child.start()
        assert queue.get(timeout=60) is imported
        child.join(30)
    assert sys.modules["__main__"] is main  # put back


FRONT_END = "import sys, trd.engines.loop; print({'transformers', 'aiohttp'} & {*sys.modules})"
ENGINE_START = """
import sys
from pathlib import Path
from trd.engines.loop import build
from trd.engines.spec import EngineSpec
build(EngineSpec.of(Path(sys.argv[1]), kv_tokens=256, dtype="float32"), lambda *a: None)
print("torch._dynamo" in sys.modules)
"""


def test_an_engine_s_code_imports_no_front_end() -> None:
    """Every engine process imports trd.engines.loop; transformers (the front end's
    tokenizer) there cost each engine start ~0.9 s of CPU (qkernel took its cache folder
    from the fixtures' module, which trains tokenizers with transformers)."""
    done = subprocess.run([sys.executable, "-c", FRONT_END], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "set()"


def test_an_engine_starts_without_torch_dynamo(tiny_models: dict[str, Path]) -> None:
    """Building the model on the meta device once ran nn.Embedding's random init there,
    whose normal_ imports torch._dynamo: 2.5 s of CPU on every engine start. An engine's
    whole start (load, warm-up forward) needs none of it."""
    done = subprocess.run([sys.executable, "-c", ENGINE_START, str(tiny_models["small"])],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]
