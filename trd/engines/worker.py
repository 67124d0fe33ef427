"""The engine process: load the model, then loop over rings, forward, route.

    drain inbound rings -> handle messages -> one forward + routing -> repeat
    nothing runnable, a request away at a peer: poll the rings for up to spin_ms
    nothing runnable otherwise: announce sleep on every inbound ring, block on the eventfd

No global barrier: each engine advances at its own pace. A full outbound ring applies
back-pressure; while waiting for room the engine keeps draining its own inbound rings
into a backlog, so two engines writing to each other can never deadlock.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import select
import signal
import time
import traceback

import torch

from trd.engines.engine import Engine
from trd.engines.request import State
from trd.engines.router import RoutingEngine
from trd.engines.spec import EngineSpec
from trd.ipc.counters import Counters
from trd.ipc.mesh import Endpoint
from trd.ipc.names import FRONTEND
from trd.ipc.ring import Ring, RingClosed
from trd.policies import PolicyContext, make_policy
from trd.protocol import Control, Message, ProtocolError, Ready, Stats, decode, encode

log = logging.getLogger("trd.engine")
PR_SET_PDEATHSIG = 1
STATS_INTERVAL = 0.5


class Outbox:
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.backlog: list[bytes] = []

    def send(self, node: int, msg: Message) -> None:
        ring = self.endpoint.outbound[node]
        frame = encode(msg)
        wait = 20e-6
        while not self._try_put(ring, frame):
            self.backlog.extend(self.drain_rings())
            time.sleep(wait)
            wait = min(2 * wait, 1e-3)

    @staticmethod
    def _try_put(ring: Ring, frame: bytes) -> bool:
        try:
            return ring.try_put(frame)
        except RingClosed:
            log.warning("dropped a message to %s: its consumer is gone", ring.name)
            return True

    def drain_rings(self) -> list[bytes]:
        return [f for ring in self.endpoint.inbound.values() for f in ring.get_all()]

    def drain(self) -> list[bytes]:
        frames, self.backlog = self.backlog + self.drain_rings(), []
        return frames


def spin(endpoint: Endpoint, seconds: float) -> None:
    """Poll the inbound rings for up to `seconds`, returning as soon as a frame waits.

    Waking a sleeping process costs 30 us on a warm core and 150-200 us on an idle
    virtual CPU; an engine whose request is at a peer polls instead, for a bounded
    time, yielding the core to anything else runnable (the front end).
    """
    end = time.perf_counter() + seconds
    while not endpoint.readable() and time.perf_counter() < end:
        os.sched_yield()


def _die_with_parent() -> None:
    # The supervisor may be killed with SIGKILL; an orphaned engine must not linger.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stats_body(spec: EngineSpec, router: RoutingEngine) -> str:
    sched = router.engine.scheduler
    states = [r.state for r in sched.requests.values()]
    alloc = sched.allocator
    body = {
        "model": spec.model,
        "name": spec.name,
        "pid": os.getpid(),
        "path": spec.path,
        "dtype": spec.dtype,
        "device": spec.device,
        "policy": router.policy.describe(),
        "running": states.count(State.RUNNING),
        "waiting": states.count(State.WAITING),
        "pending": states.count(State.PENDING),
        "kv_pages_total": alloc.num_pages,
        "kv_pages_used": alloc.num_pages - alloc.num_free,
        "page_size": alloc.page_size,
        "thresholds": router.thresholds,
        "max_wait_ms": router.max_wait * 1e3,
        "time": time.time(),
        **router.stats.snapshot(),
    }
    return json.dumps(body)


def handle_control(router: RoutingEngine, body: str) -> None:
    try:
        cmd = json.loads(body)
        if cmd.get("op") == "set_thresholds":
            router.set_thresholds(list(cmd["thresholds"]), float(cmd.get("max_wait_ms", 20.0)))
            log.info("thresholds now %s, max_wait_ms %s", router.thresholds, router.max_wait * 1e3)
        elif cmd.get("op") != "stats":
            raise ValueError(f"unknown op {cmd.get('op')!r}")
    except (ValueError, KeyError, TypeError) as exc:
        log.error("bad control command %r: %s", body[:200], exc)


def engine_main(spec: EngineSpec, endpoint: Endpoint, counters: Counters | None = None) -> None:
    """Entry point of a spawned engine process."""
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s engine[{spec.name}] %(message)s")
    _die_with_parent()
    os.environ.update(spec.env)
    torch.set_num_threads(spec.threads)
    outbox = Outbox(endpoint)
    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        with contextlib.suppress(ValueError):  # the eventfd is closed after a failed start
            endpoint.wakeup.signal()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when we stop
    try:
        engine = Engine(
            spec.path,
            dtype=spec.dtype,
            device=spec.device,
            kv_tokens=spec.kv_tokens,
            page_size=spec.page_size,
            max_batch_tokens=spec.max_batch_tokens,
            max_batch_size=spec.max_batch_size,
            max_model_len=spec.max_model_len,
            attention=spec.attention,
            cpu_linear=spec.cpu_linear,
        )
        embed = engine.runner.model.model.embed_tokens
        ctx = PolicyContext(spec.model, spec.num_models, embed)
        policy = make_policy(spec.policy, ctx, dict(spec.policy_params))
    except Exception as exc:
        log.error("failed to start: %s\n%s", exc, traceback.format_exc())
        outbox.send(FRONTEND, Ready(spec.model, os.getpid(), 0, spec.page_size, error=str(exc)))
        endpoint.close()
        return
    router = RoutingEngine(engine, policy, spec.model, spec.num_models, outbox.send)
    router.counters = counters
    router.pending_kv, router.step_sync = spec.pending_kv, spec.step_sync
    router.set_thresholds(list(spec.thresholds), spec.max_wait_ms)
    alloc = engine.scheduler.allocator
    outbox.send(FRONTEND, Ready(spec.model, os.getpid(), alloc.num_pages, alloc.page_size))
    log.info("ready: %s (%s, %s), %d KV pages", spec.path, spec.dtype, spec.device, alloc.num_pages)
    efd = endpoint.wakeup.fileno()
    spin_s = spec.spin_ms / 1e3
    last_stats = 0.0
    idle_since: float | None = None  # start of the current stretch without a forward
    while not stopping:
        for frame in outbox.drain():
            try:
                msg = decode(frame)
            except ProtocolError as exc:
                log.error("dropped a malformed frame: %s", exc)
                continue
            if isinstance(msg, Control):
                handle_control(router, msg.body)
                last_stats = 0.0  # answer with fresh stats
            else:
                router.handle(msg)
        now = time.perf_counter()
        delay = router.launch_delay(now)
        if delay == 0.0:
            router.publish_busy()  # before the forward: peers see this engine working
            router.step()
        router.publish_busy()
        if now - last_stats >= STATS_INTERVAL:
            outbox.send(FRONTEND, Stats(spec.model, stats_body(spec, router)))
            last_stats = now
        if delay == 0.0:
            idle_since = None
            continue
        if idle_since is None:
            idle_since = now
        spin_left = min(delay, idle_since + spin_s - now)
        if spin_left > 0 and router.expects_return():
            spin(endpoint, spin_left)
            continue
        if endpoint.prepare_sleep():
            select.select([efd], [], [], min(delay, STATS_INTERVAL))
            endpoint.wake()
    endpoint.close()
