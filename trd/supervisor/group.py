"""A group of engine processes wired by rings, and the requests in flight on them.

    group = EngineGroup(specs); group.start()
    gen = group.submit(prompt, params)
    while not gen.complete: group.pump(timeout=1.0)
    group.close()

Used by the daemon (driven from its event loop through `on_readable`), the tests and
the benchmarks (driven by `pump`). Nothing here blocks: a frame for a full ring waits
in a queue that `flush` (called on every pump / wake-up, and by the daemon's timer
while anything waits) retries in order. An engine that dies fails its requests with an
error naming it, and the survivors are told to free them.

A remote engine (RemoteSpec) gets a link process in its place, with the same rings
(trd/remote/link.py); the link's end reads as the engine's death: "remote engine 'large'
at HOST:PORT: connection lost".
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import secrets
import select
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from trd.engines.boot import engine_process, without_main
from trd.engines.spec import EngineSpec
from trd.ipc.counters import Counters
from trd.ipc.mesh import Mesh
from trd.ipc.names import FRONTEND, cleanup_stale, instance_prefix
from trd.ipc.ring import RingClosed
from trd.protocol import (
    Abort,
    Control,
    Done,
    Emit,
    Message,
    ProtocolError,
    Ready,
    SamplingParams,
    Stats,
    Submit,
    decode,
    encode,
)
from trd.remote.link import EXIT_LINK_LOST, link_process
from trd.remote.spec import RemoteSpec
from trd.supervisor.generation import Generation, cpu_ticks, stalled_requests

log = logging.getLogger("trd.group")


class EngineStartError(RuntimeError):
    """An engine did not become ready; the message names it and why."""


def describe(spec: EngineSpec | RemoteSpec) -> str:
    """How messages name an engine: "engine 'small'", "remote engine 'large' at H:P"."""
    return spec.describe() if isinstance(spec, RemoteSpec) else f"engine {spec.name!r}"


def prefill_ahead(specs: Sequence[EngineSpec | RemoteSpec]) -> list[int]:
    """The engines besides the entry that take each new prompt too, to prefill it."""
    return [s.index for s in specs if s.index != 0 and s.settings.prefill_ahead]


def submit_to(params: SamplingParams, ahead: Sequence[int]) -> list[int]:
    """The engines a new request's Submit goes to: the entry and those that prefill ahead,
    or the one model a request pinned to it (`routing.model`) never leaves."""
    pin = params.routing.model
    return [0, *ahead] if pin is None else [pin]


class EngineGroup:
    def __init__(
        self, specs: Sequence[EngineSpec | RemoteSpec], ring_capacity: int = 4 << 20
    ) -> None:
        if not specs:
            raise ValueError("an engine group needs at least one engine")
        self.specs = list(specs)
        self.ahead = prefill_ahead(self.specs)  # they get each Submit too
        self.ring_capacity = ring_capacity
        self.procs: list[BaseProcess] = []
        self.ready: dict[int, Ready] = {}
        self.gens: dict[int, Generation] = {}
        self.dead: dict[int, str] = {}
        self.stats: dict[int, dict[str, Any]] = {}  # latest Stats body per engine
        # When each engine was last heard from: its Stats (at least every 0.5 s, and after
        # every step), or, for a local engine, CPU time spent since the last look (one
        # forward may outlast the stall limit on a CPU; a stopped or blocked one spends none).
        self.heard: dict[int, float] = {}
        self._ticks: dict[int, int] = {}
        # Request ids: a random high half per group, so ids never repeat across restarts
        # and a log line's id names one request of one daemon.
        self._rid_base = secrets.randbits(31) << 32
        self._rid = 0
        self._queued: dict[int, deque[bytes]] = {}
        self.on_queued: Callable[[], None] = lambda: None  # a frame waits for ring space
        self.mesh: Mesh | None = None
        self.counters: Counters | None = None

    # -- lifecycle --------------------------------------------------------------------
    def start(self, timeout: float = 300.0, cancelled: Callable[[], bool] = lambda: False) -> None:
        cleanup_stale()
        self.prefix = instance_prefix(os.getpid(), secrets.token_hex(4))
        self.mesh = Mesh(self.prefix, len(self.specs), self.ring_capacity)
        self.counters = Counters.create(self.prefix + "counters", len(self.specs))
        self.endpoint = self.mesh.endpoint(FRONTEND)
        self._queued = {spec.index: deque() for spec in self.specs}
        ctx = mp.get_context("spawn")
        try:
            for spec in self.specs:
                args = (os.getpid(), spec, self.mesh.endpoint(spec.index), self.counters)
                remote = isinstance(spec, RemoteSpec)
                proc = ctx.Process(target=link_process if remote else engine_process, args=args,
                                   name=f"trd-{'link' if remote else 'engine'}-{spec.name}",
                                   daemon=True)  # fmt: skip
                with without_main():
                    proc.start()
                self.procs.append(proc)
            self._await_ready(timeout, cancelled)
        except BaseException:
            self.close()
            raise

    def _await_ready(self, timeout: float, cancelled: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout
        while len(self.ready) < len(self.specs):
            if cancelled():
                raise EngineStartError("the daemon stopped while the engines were starting")
            for msg in self._drain():
                if isinstance(msg, Ready):
                    if msg.error:
                        who = describe(self.specs[msg.model])
                        raise EngineStartError(f"{who} failed to start: {msg.error}")
                    self.ready[msg.model] = msg
                    self.heard[msg.model] = time.monotonic()
            for spec, proc in zip(self.specs, self.procs, strict=True):
                if spec.index not in self.ready and proc.exitcode is not None:
                    raise EngineStartError(
                        f"{describe(spec)} exited with code {proc.exitcode} before it was ready"
                    )
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [s.name for s in self.specs if s.index not in self.ready]
                raise EngineStartError(f"engines {missing} not ready after {timeout:.0f} s")
            self._sleep(min(left, 0.5))

    def close(self, grace: float = 5.0) -> None:
        """Stop every engine (SIGTERM, then SIGKILL after `grace`) and unlink the rings."""
        for proc in self.procs:
            if proc.exitcode is None:
                proc.terminate()
        deadline = time.monotonic() + grace
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        if self.mesh is not None:
            self.mesh.unlink_all()
            self.mesh = None
        if self.counters is not None:
            self.counters.close()
            self.counters = None

    # -- requests ---------------------------------------------------------------------
    def submit(self, prompt: Sequence[int], params: SamplingParams) -> Generation:
        if self.dead:
            raise RuntimeError(f"engine group is degraded: {'; '.join(self.dead.values())}")
        self._rid += 1
        gen = Generation(self._rid_base | self._rid, len(prompt))
        self.gens[gen.rid] = gen
        submit = Submit(gen.rid, np.asarray(prompt, dtype=np.int32), params)
        for j in submit_to(params, self.ahead):  # prefill ahead: the prompt's KV there too
            self._send(j, submit)
        return gen

    def abort(self, rid: int) -> None:
        """The client is gone: every live engine frees the request."""
        gen = self.gens.pop(rid, None)
        if gen is not None and not gen.complete:
            for spec in self.specs:
                if spec.index not in self.dead:
                    self._send(spec.index, Abort(rid))

    def forget(self, rid: int) -> Generation | None:
        return self.gens.pop(rid, None)

    def fail_stalled(self, limit_s: float) -> list[Generation]:
        """Fail the requests `stalled` finds (504)."""
        now = time.monotonic()
        self._hear_working(now)
        wait, stalled = stalled_requests(self.gens.values(), self.heard, now, limit_s)
        for gen in stalled:
            gen.fail(f"no progress from the engines for {wait:.0f} s", status=504)
            self.abort(gen.rid)
        return stalled

    def _hear_working(self, now: float) -> None:
        """Count a local engine as heard from when it spent CPU time since the last look."""
        for spec, proc in zip(self.specs, self.procs, strict=True):
            if isinstance(spec, RemoteSpec) or proc.pid is None:
                continue
            ticks = cpu_ticks(proc.pid)
            if ticks is None:
                continue
            if ticks != self._ticks.setdefault(spec.index, ticks):
                self.heard[spec.index] = now
            self._ticks[spec.index] = ticks

    def set_active(self, n: int) -> None:
        """Publish the number of active requests (indexes the batching thresholds)."""
        if self.counters is not None:
            self.counters.set_active(n)

    def control(self, model: int, body: dict[str, Any]) -> None:
        """Send a JSON command to one engine (it answers with a fresh Stats)."""
        self._send(model, Control(json.dumps(body)))

    # -- outbound, never blocking -----------------------------------------------------
    def _send(self, node: int, msg: Message) -> None:
        self._queued[node].append(encode(msg))
        if self.flush():
            self.on_queued()

    def flush(self) -> bool:
        """Put queued frames into their rings, in order; True while some still wait."""
        for node, queue in self._queued.items():
            ring = self.endpoint.outbound[node]
            try:
                while queue and ring.try_put(queue[0]):
                    queue.popleft()
            except RingClosed:
                queue.clear()  # the engine is dead; its requests are failed already
        return any(self._queued.values())

    # -- inbound ----------------------------------------------------------------------
    def pump(self, timeout: float = 0.0) -> int:
        """Handle everything the engines sent, waiting up to `timeout` for something."""
        self.flush()
        msgs = self._drain()
        if not msgs and timeout > 0:
            self._sleep(timeout)
            msgs = self._drain()
        for msg in msgs:
            self._dispatch(msg)
        self._check_engines()
        return len(msgs)

    def on_readable(self) -> None:
        """Reader callback for the wake-up fd (and the sentinels): handle everything the
        engines sent, then re-arm the sleep flags so the next frame signals the fd."""
        self.endpoint.wake()
        self.flush()
        while True:
            for msg in self._drain():
                self._dispatch(msg)
            self._check_engines()
            if self.endpoint.prepare_sleep():
                return

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, Emit | Done):
            gen = self.gens.get(msg.rid)
            if gen is not None:
                (gen.on_emit if isinstance(msg, Emit) else gen.on_done)(msg)  # type: ignore[arg-type]
        elif isinstance(msg, Stats):
            self.heard[msg.model] = time.monotonic()
            try:
                self.stats[msg.model] = json.loads(msg.body)
            except json.JSONDecodeError as exc:
                log.error("engine %d sent unreadable stats: %s", msg.model, exc)

    def _drain(self) -> list[Message]:
        msgs = []
        for ring in self.endpoint.inbound.values():
            for frame in ring.get_all():
                try:
                    msgs.append(decode(frame))
                except ProtocolError as exc:
                    log.error("dropped a malformed frame from %s: %s", ring.name, exc)
        return msgs

    def _sleep(self, timeout: float) -> None:
        if self.endpoint.prepare_sleep():
            fds = [self.endpoint.wakeup.fileno(), *(p.sentinel for p in self.procs)]
            select.select(fds, [], [], timeout)
            self.endpoint.wake()

    def _check_engines(self) -> None:
        for spec, proc in zip(self.specs, self.procs, strict=True):
            if spec.index in self.dead or proc.exitcode is None:
                continue
            reason = f"engine {spec.name!r} (pid {proc.pid}) died with exit code {proc.exitcode}"
            if isinstance(spec, RemoteSpec):
                reason = f"{spec.describe()}: " + (
                    "connection lost" if proc.exitcode == EXIT_LINK_LOST
                    else f"its link process (pid {proc.pid}) died with exit code {proc.exitcode}"
                )  # fmt: skip
            self.dead[spec.index] = reason
            assert self.mesh is not None
            for (_, dst), ring in self.mesh.rings.items():
                if dst == spec.index:
                    ring.mark_closed()  # peers sending to it fail fast instead of waiting
            for gen in list(self.gens.values()):
                if not gen.complete:
                    gen.fail(reason)
                    self.abort(gen.rid)

    @property
    def wakeup_fd(self) -> int:
        return self.endpoint.wakeup.fileno()

    @property
    def sentinels(self) -> list[int]:
        """Readable when the corresponding engine process exits."""
        return [p.sentinel for p in self.procs]
