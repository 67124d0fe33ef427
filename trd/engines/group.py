"""A group of engine processes wired by rings, driven without HTTP.

    group = EngineGroup(specs); group.start()
    rid = group.submit(prompt, params)
    while not group.tracked[rid].complete: group.pump(timeout=1.0)
    group.close()

Used by the tests, the benchmarks and the daemon's front end. `pump` reads whatever
the engines sent, feeds the trackers and notices dead engines: requests in flight then
fail with an error naming the engine, and the survivors are told to free them.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import secrets
import select
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from trd.engines.spec import EngineSpec
from trd.engines.tracker import Tracked
from trd.ipc.counters import Counters
from trd.ipc.mesh import Mesh
from trd.ipc.names import FRONTEND, cleanup_stale, instance_prefix
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

Listener = Callable[[Tracked, list[tuple[int, int]]], None]


class Overloaded(RuntimeError):
    """The entry engine cannot take another request right now."""


class EngineStartError(RuntimeError):
    """An engine did not become ready; the message names it and why."""


class EngineGroup:
    def __init__(self, specs: Sequence[EngineSpec], ring_capacity: int = 4 << 20) -> None:
        if not specs:
            raise ValueError("an engine group needs at least one engine")
        self.specs = list(specs)
        self.ring_capacity = ring_capacity
        self.procs: list[BaseProcess] = []
        self.ready: dict[int, Ready] = {}
        self.tracked: dict[int, Tracked] = {}
        self.dead: dict[int, str] = {}
        self.stats: dict[int, dict[str, Any]] = {}  # latest Stats body per engine
        self.listener: Listener | None = None  # called with newly released tokens
        self._rid = 0
        self.mesh: Mesh | None = None
        self.counters: Counters | None = None

    # -- lifecycle --------------------------------------------------------------------
    def start(self, timeout: float = 300.0) -> None:
        cleanup_stale()
        self.prefix = instance_prefix(os.getpid(), secrets.token_hex(4))
        self.mesh = Mesh(self.prefix, len(self.specs), self.ring_capacity)
        self.counters = Counters.create(self.prefix + "counters", len(self.specs))
        self.endpoint = self.mesh.endpoint(FRONTEND)
        # Imported here: the engine pulls in torch, which the supervisor never needs.
        from trd.engines.worker import engine_main

        ctx = mp.get_context("spawn")
        try:
            for spec in self.specs:
                proc = ctx.Process(
                    target=engine_main,
                    args=(spec, self.mesh.endpoint(spec.model), self.counters),
                    name=f"trd-engine-{spec.name}",
                    daemon=True,
                )
                proc.start()
                self.procs.append(proc)
            self._await_ready(timeout)
        except BaseException:
            self.close()
            raise

    def _await_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while len(self.ready) < len(self.specs):
            for msg in self._drain():
                if isinstance(msg, Ready):
                    if msg.error:
                        name = self.specs[msg.model].name
                        raise EngineStartError(f"engine {name!r} failed to start: {msg.error}")
                    self.ready[msg.model] = msg
            for spec, proc in zip(self.specs, self.procs, strict=True):
                if spec.model not in self.ready and proc.exitcode is not None:
                    raise EngineStartError(
                        f"engine {spec.name!r} exited with code {proc.exitcode} before it was ready"
                    )
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [s.name for s in self.specs if s.model not in self.ready]
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
            self.counters.unlink()

    # -- requests ---------------------------------------------------------------------
    def submit(self, prompt: Sequence[int], params: SamplingParams) -> int:
        if self.dead:
            raise RuntimeError(f"engine group is degraded: {'; '.join(self.dead.values())}")
        self._rid += 1
        rid = self._rid
        self.tracked[rid] = Tracked(rid)
        msg = Submit(rid, np.asarray(prompt, dtype=np.int32), params, time.time())
        assert self.mesh is not None, "start() first"
        if not self.endpoint.outbound[0].try_put(encode(msg)):
            del self.tracked[rid]
            raise Overloaded("the entry engine's inbound ring is full")
        return rid

    def abort(self, rid: int) -> None:
        tracked = self.tracked.pop(rid, None)
        if tracked is not None and not tracked.complete:
            for spec in self.specs:
                if spec.model not in self.dead:
                    self._send(spec.model, Abort(rid))

    def forget(self, rid: int) -> Tracked | None:
        return self.tracked.pop(rid, None)

    def set_active(self, n: int) -> None:
        """Publish the number of active requests (indexes the batching thresholds)."""
        if self.counters is not None:
            self.counters.set_active(n)

    def _send(self, node: int, msg: Message) -> None:
        assert self.mesh is not None, "start() first"
        self.endpoint.outbound[node].put(encode(msg), timeout=30.0)

    # -- inbound ----------------------------------------------------------------------
    def pump(self, timeout: float = 0.0) -> int:
        """Handle everything the engines sent, waiting up to `timeout` for something."""
        msgs = self._drain()
        if not msgs and timeout > 0:
            self._sleep(timeout)
            msgs = self._drain()
        for msg in msgs:
            self._dispatch(msg)
        self._check_engines()
        return len(msgs)

    def _dispatch(self, msg: Message) -> None:
        if isinstance(msg, Emit):
            tracked = self.tracked.get(msg.rid)
            if tracked is not None:
                released = tracked.on_emit(msg)
                if self.listener is not None and (released or tracked.complete):
                    self.listener(tracked, released)
        elif isinstance(msg, Done):
            tracked = self.tracked.get(msg.rid)
            if tracked is not None:
                tracked.on_done(msg)
        elif isinstance(msg, Stats):
            with contextlib.suppress(json.JSONDecodeError):
                self.stats[msg.model] = json.loads(msg.body)

    def _drain(self) -> list[Message]:
        msgs = []
        for ring in self.endpoint.inbound.values():
            for frame in ring.get_all():
                try:
                    msgs.append(decode(frame))
                except ProtocolError:
                    continue  # our own engines never send these; nothing to recover
        return msgs

    def _sleep(self, timeout: float) -> None:
        if self.endpoint.prepare_sleep():
            fds = [self.endpoint.wakeup.fileno(), *(p.sentinel for p in self.procs)]
            select.select(fds, [], [], timeout)
            self.endpoint.wake()

    def _check_engines(self) -> None:
        for spec, proc in zip(self.specs, self.procs, strict=True):
            if spec.model in self.dead or proc.exitcode is None:
                continue
            reason = f"engine {spec.name!r} (pid {proc.pid}) died with exit code {proc.exitcode}"
            self.dead[spec.model] = reason
            assert self.mesh is not None
            for (_, dst), ring in self.mesh.rings.items():
                if dst == spec.model:
                    ring.mark_closed()  # peers sending to it fail fast instead of waiting
            for tracked in self.tracked.values():
                if not tracked.complete:
                    tracked.fail(reason)
                    if self.listener is not None:
                        self.listener(tracked, [])
                    for other in self.specs:
                        if other.model not in self.dead:
                            self._send(other.model, Abort(tracked.rid))

    # -- asyncio integration ------------------------------------------------------------
    @property
    def wakeup_fd(self) -> int:
        return self.endpoint.wakeup.fileno()

    @property
    def sentinels(self) -> list[int]:
        """Readable when the corresponding engine process exits."""
        return [p.sentinel for p in self.procs]

    def on_readable(self) -> None:
        """Reader callback for `wakeup_fd` (and the sentinels): handle everything the
        engines sent, then re-arm the sleep flags so the next frame signals the fd."""
        self.endpoint.wake()
        while True:
            for msg in self._drain():
                self._dispatch(msg)
            self._check_engines()
            if self.endpoint.prepare_sleep():
                return

    def control(self, model: int, body: dict[str, Any]) -> None:
        """Send a JSON command to one engine (it answers with a fresh Stats)."""
        self._send(model, Control(json.dumps(body)))


def run_closed_loop(
    group: EngineGroup,
    jobs: Sequence[tuple[Sequence[int], SamplingParams]],
    concurrency: int,
    timeout: float = 600.0,
) -> list[Tracked]:
    """Keep `concurrency` jobs in flight (a finished one is replaced at once); in job order.

    A job is complete when its tokens are in and every engine that held it has
    reported freeing it (so per-engine work counts are final).
    """
    results: list[Tracked | None] = [None] * len(jobs)
    inflight: dict[int, int] = {}
    nxt = 0
    deadline = time.monotonic() + timeout
    while nxt < len(jobs) or inflight:
        while nxt < len(jobs) and len(inflight) < concurrency:
            inflight[group.submit(*jobs[nxt])] = nxt
            nxt += 1
        group.set_active(len(inflight))
        group.pump(timeout=0.05)
        for rid in [r for r in inflight if group.tracked[r].complete]:
            tracked = group.tracked[rid]
            if tracked.all_done or tracked.error:
                results[inflight.pop(rid)] = group.forget(rid)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(inflight)} requests still in flight after {timeout} s")
    return [r for r in results if r is not None]
