"""The engine process: load the model, then loop over rings, forward, route.

    drain inbound rings -> handle messages -> launch? -> one forward + routing -> repeat
    nothing to launch, a request away at a peer: poll the rings for up to spin_ms
    nothing to launch otherwise: announce sleep on every inbound ring, block on the eventfd

No global barrier: each engine advances at its own pace. A full outbound ring applies
back-pressure; while waiting for room the engine keeps draining its own inbound rings
into a backlog, so two engines writing to each other can never deadlock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch

from trd.engines.engine import Engine
from trd.engines.memory import Trimmer, heap, resident
from trd.engines.outbound import PeerGone, Send
from trd.engines.prefix_cache import PrefixCache
from trd.engines.request import State
from trd.engines.router import RoutingEngine
from trd.engines.spec import EngineSpec
from trd.ipc.counters import Counters
from trd.ipc.mesh import Endpoint
from trd.ipc.names import FRONTEND
from trd.ipc.ring import Ring, RingClosed
from trd.policies.base import PolicyContext
from trd.policies.factory import make_policy
from trd.protocol import Control, Message, ProtocolError, Ready, Stats, decode, encode

log = logging.getLogger("trd.engine")
STATS_INTERVAL = 0.5


class Rings:
    """Frames to other nodes over the rings; inbound frames are kept while it waits."""

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
            raise PeerGone(f"{ring.name}: its consumer is gone") from None

    def drain_rings(self) -> list[bytes]:
        return [f for ring in self.endpoint.inbound.values() for f in ring.get_all()]

    def receive(self) -> Iterator[Message]:
        """The frames waiting now, each decoded when the caller takes it: a handoff is
        handled before the frames behind it are decoded (they wait, it does not)."""
        frames, self.backlog = self.backlog + self.drain_rings(), []
        for frame in frames:
            try:
                msg = decode(frame)
            except ProtocolError as exc:
                log.error("dropped a malformed frame: %s", exc)
                continue
            yield msg


def handle_inbound(node: RoutingEngine, rings: Rings) -> bool:
    """Handle every message waiting on the rings; True if one was a control command."""
    control = False
    for msg in rings.receive():
        if isinstance(msg, Control):
            handle_control(node, msg.body)
            control = True
        else:
            node.inbox.handle(msg)
    return control


def spin(endpoint: Endpoint, seconds: float, stop: Callable[[], bool]) -> None:
    """Poll the inbound rings for up to `seconds`, returning as soon as a frame waits
    or `stop()` (a peer's forward wants this core).

    Waking a sleeping process costs 30 us on a warm core and 150-200 us on an idle
    virtual CPU; an engine whose request is at a peer polls instead, for a bounded
    time, yielding the core to anything else runnable (the front end).
    """
    end = time.perf_counter() + seconds
    while not endpoint.readable() and time.perf_counter() < end and not stop():
        os.sched_yield()


def stats_body(spec: EngineSpec, node: RoutingEngine, trims: int = 0) -> str:
    sched = node.engine.scheduler
    # A prefill ahead is no request of this engine's (yet): counted apart, so the
    # running and waiting columns and the queue-depth gauge count only requests.
    ahead = sum(r.prefill_only for r in sched.requests.values())
    states = [r.state for r in sched.requests.values() if not r.prefill_only]
    alloc = sched.allocator
    body = {
        "model": spec.index, "name": spec.name, "pid": os.getpid(),
        "path": str(spec.checkpoint.path), "dtype": spec.dtype, "device": spec.device,
        "quantization": node.engine.runner.quantization,
        "crossover": node.engine.runner.crossover,
        "weight_bytes": node.engine.runner.weight_bytes,
        "policy": {"name": spec.policy.name, **spec.policy.params},
        "policy_threshold": node.policy.threshold,
        "running": states.count(State.RUNNING), "waiting": states.count(State.WAITING),
        "pending": states.count(State.PENDING), "prefilling_ahead": ahead,
        "kv_pages_total": alloc.num_pages,
        "kv_pages_used": alloc.num_pages - alloc.num_free, "page_size": alloc.page_size,
        "prefix_cache": prefix_cache_stats(sched.cache),
        "thresholds": node.launch.thresholds, "max_wait_ms": node.launch.max_wait * 1e3,
        "held_launches": node.launch.held_launches, "held_s": node.launch.held_seconds,
        "threads": spec.threads, "wide_forwards": node.threads.wide_forwards,
        "memory": {**resident(), **heap(), "heap_trims": trims}, "live": live_counts(node),
        "time": time.time(), **node.stats.snapshot(),
    }  # fmt: skip
    return json.dumps(body)


def live_counts(node: RoutingEngine) -> dict[str, int]:
    """The engine's structures that grow with traffic, each bounded: requests it holds
    (0 when idle), finished ids it remembers (up to FINISHED_MEMORY), compiled grammars
    (up to engine.grammar_cache), prefix-cache blocks (up to its KV pages)."""
    cache = node.engine.scheduler.cache
    return {
        "requests": len(node.requests), "finished_remembered": len(node.out.finished),
        "grammars_cached": node.engine.constraints.num_cached,
        "prefix_blocks": 0 if cache is None else cache.num_cached,
    }  # fmt: skip


def prefix_cache_stats(cache: PrefixCache | None) -> dict[str, Any] | None:
    """The cache's pages and counters; hit rate = tokens matched / tokens asked."""
    if cache is None:
        return None
    c = cache.counters
    return {
        "cached_pages": cache.num_cached, "evictable_pages": cache.num_evictable,
        "queries": c.queried_tokens, "hits": c.hit_tokens, "evictions": c.evictions,
        "hit_rate": c.hit_tokens / c.queried_tokens if c.queried_tokens else 0.0,
    }  # fmt: skip


def handle_control(node: RoutingEngine, body: str) -> None:
    try:
        cmd = json.loads(body)
        if cmd.get("op") == "set_thresholds":
            node.launch.set(list(cmd["thresholds"]), float(cmd["max_wait_ms"]))
            log.info("thresholds now %s, max_wait_ms %s", node.launch.thresholds,
                     node.launch.max_wait * 1e3)  # fmt: skip
        elif cmd.get("op") == "set_policy_threshold":  # the daemon's share control
            node.policy.set_threshold(float(cmd["threshold"]))
            log.info("policy threshold now %.6g", node.policy.threshold)
        elif cmd.get("op") == "drop_all":  # a remote engine's daemon is gone
            rids = list(node.requests)
            for rid in rids:
                node.inbox.drop(rid)
            log.info("dropped %d request(s): the daemon's link is gone", len(rids))
        elif cmd.get("op") != "stats":
            raise ValueError(f"unknown op {cmd.get('op')!r}")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.error("bad control command %r: %s", body[:200], exc)


def build(spec: EngineSpec, send: Send, counters: Counters | None = None) -> RoutingEngine:
    """The engine of `spec` with its policy, sending through `send` (the rings here; the
    in-process drivers of tests and scripts pass their own)."""
    engine = Engine(spec)
    embed = engine.runner.model.model.embed_tokens
    ctx = PolicyContext(spec.index, spec.num_models, embed, spec.checkpoint.path)
    policy = make_policy(spec.policy, ctx)
    return RoutingEngine(engine, policy, send, counters)


def engine_main(spec: EngineSpec, endpoint: Endpoint, counters: Counters | None = None) -> None:
    """Entry point of a spawned engine process (after `boot.engine_process`)."""
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s engine[{spec.name}] %(message)s")
    os.environ.update(spec.env)
    torch.set_num_threads(spec.threads)
    rings = Rings(endpoint)
    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        with contextlib.suppress(ValueError):  # the eventfd is closed after a failed start
            endpoint.wakeup.signal()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when we stop
    page_size = spec.settings.page_size
    try:
        node = build(spec, rings.send, counters)
    except Exception as exc:
        log.error("failed to start: %s\n%s", exc, traceback.format_exc())
        rings.send(FRONTEND, Ready(spec.index, os.getpid(), 0, page_size, error=str(exc)))
        endpoint.close()
        return
    rings.send(FRONTEND, Ready(spec.index, os.getpid(), spec.kv_pages, page_size))
    log.info("ready: %s (%s, %s), %d KV pages", spec.checkpoint.path, spec.dtype, spec.device,
             spec.kv_pages)  # fmt: skip
    try:
        serve(node, spec, rings, endpoint, lambda: stopping)
    except PeerGone as exc:
        log.error("stopping: %s", exc)  # the front end is gone: nobody to serve
    endpoint.close()


def serve(
    node: RoutingEngine,
    spec: EngineSpec,
    rings: Rings,
    endpoint: Endpoint,
    stopping: Callable[[], bool],
) -> None:
    efd = endpoint.wakeup.fileno()
    spin_s = spec.settings.spin_ms / 1e3
    last_stats = 0.0
    idle_since: float | None = None  # start of the current stretch without a forward
    trimmer = Trimmer()
    while not stopping():
        if handle_inbound(node, rings):
            last_stats = 0.0  # answer a control command with fresh stats
        now = time.perf_counter()
        delay = node.launch_delay(now)
        if delay == 0.0:
            runnable = node.publish_busy()  # before the forward: peers see this engine working
            torch.set_num_threads(node.threads.begin(runnable))
            node.step()
            node.threads.end()
            if not node.requests:  # idle now: every page is free or cached, none leaked
                node.engine.check_integrity()
            # What arrived during the step first: a handoff waits for nothing else.
            if handle_inbound(node, rings):
                last_stats = 0.0
        node.publish_busy()
        trimmer.tick(now)
        if now - last_stats >= STATS_INTERVAL:
            rings.send(FRONTEND, Stats(spec.index, stats_body(spec, node, trimmer.trims)))
            last_stats = now
        if delay == 0.0:
            idle_since = None
            continue
        idle_since = now if idle_since is None else idle_since
        spin_left = min(delay, idle_since + spin_s - now)
        if spin_left > 0 and node.expects_return() and not node.threads.peer_wide():
            spin(endpoint, spin_left, node.threads.peer_wide)
        elif endpoint.prepare_sleep():
            select.select([efd], [], [], min(delay, STATS_INTERVAL))
            endpoint.wake()
