"""The routing half of an engine: messages in, policy decisions out.

`RoutingEngine` wraps a single-model `Engine` and a `RoutingPolicy`. It does not know
about processes or rings: it receives decoded messages through `handle()` and sends
through a `send(node, msg)` callable, so tests can wire engines together in-process.

Exactly-once commits: the request is active on exactly one engine at a time; only that
engine commits. A `PeerReq` is applied only if its `handoff_seq` is newer than the last
one seen for the request, and never for a finished request (a bounded memory of
finished ids), so duplicates, stale copies and late messages change nothing.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from trd.engines.engine import Engine
from trd.engines.request import Request, State
from trd.engines.scheduler import RequestTooLarge
from trd.engines.stats import EngineStats
from trd.ipc.counters import Counters
from trd.ipc.names import FRONTEND
from trd.policies import RoutingPolicy, StepView
from trd.protocol import Abort, Done, Emit, FinishReason, Message, PeerKind, PeerReq, Submit

log = logging.getLogger(__name__)
FINISHED_MEMORY = 1 << 16
BARRIER_POLL_S = 50e-6
Send = Callable[[int, Message], None]


class RoutingEngine:
    def __init__(
        self, engine: Engine, policy: RoutingPolicy, model: int, num_models: int, send: Send
    ) -> None:
        self.engine, self.policy = engine, policy
        self.model, self.num_models = model, num_models
        self.send = send
        self.finished: OrderedDict[int, None] = OrderedDict()
        self.step_end = 0.0  # perf_counter() when the last step (forward + routing) finished
        self.stats = EngineStats()
        # Delayed batching: launch only with >= thresholds[min(active, len) - 1] runnable
        # requests, unless no more can arrive or the oldest has waited max_wait.
        self.thresholds: list[int] = [1]
        self.max_wait = 0.02
        self.counters: Counters | None = None
        self.pending_kv = True  # ablation switches, see EngineSpec
        self.step_sync = False
        self.completed_steps = 0
        self.was_idle = True

    def set_thresholds(self, thresholds: list[int], max_wait_ms: float) -> None:
        if not thresholds or any(not isinstance(b, int) or b < 1 for b in thresholds):
            raise ValueError(
                f"thresholds must be a non-empty list of ints >= 1, got {thresholds!r}"
            )
        if not max_wait_ms >= 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms!r}")
        self.thresholds, self.max_wait = list(thresholds), max_wait_ms / 1e3

    def launch_delay(self, now: float) -> float:
        """0 when a forward should launch now; else seconds until it must (inf: idle)."""
        runnable = self.engine.scheduler.runnable()
        if not runnable:
            return float("inf")
        active = self.counters.active if self.counters is not None else len(runnable)
        need = self.thresholds[min(max(active, 1), len(self.thresholds)) - 1]
        if self.step_sync and self.counters is not None and self._behind_barrier():
            return BARRIER_POLL_S
        if len(runnable) >= need:
            return 0.0
        if self.counters is None or self.counters.others_idle(self.model):
            return 0.0  # nothing else can arrive: waiting would deadlock
        waited = now - min(r.runnable_since for r in runnable)
        return max(0.0, self.max_wait - waited)

    def _behind_barrier(self) -> bool:
        """step_sync ablation: forward k+1 waits until every busy peer finished forward k."""
        c = self.counters
        assert c is not None
        peers = [j for j in range(self.num_models) if j != self.model and c.busy(j) > 0]
        if self.was_idle:
            # Joining after idling: skip the global steps this engine had no work in.
            self.completed_steps = max([self.completed_steps, *(c.steps(j) for j in peers)])
            c.set_steps(self.model, self.completed_steps)
            self.was_idle = False
        return any(c.steps(j) < self.completed_steps for j in peers)

    def publish_busy(self) -> None:
        if self.counters is not None:
            busy = len(self.engine.scheduler.runnable())
            self.counters.set_busy(self.model, busy)
            self.was_idle = self.was_idle or busy == 0

    def expects_return(self) -> bool:
        """Some request of this engine is away at a peer, so a handoff back may come soon."""
        return any(r.state is State.PENDING for r in self.requests.values())

    @property
    def requests(self) -> dict[int, Request]:
        return self.engine.scheduler.requests

    # -- inbound ----------------------------------------------------------------------
    def handle(self, msg: Message) -> None:
        if isinstance(msg, Submit):
            self._on_submit(msg)
        elif isinstance(msg, PeerReq):
            if msg.kind is PeerKind.HANDOFF:
                self._on_handoff(msg)
            else:
                self._drop(msg.rid)
        elif isinstance(msg, Abort):
            self._drop(msg.rid)
        else:
            log.warning("engine %d ignores unexpected %s", self.model, type(msg).__name__)

    def _on_submit(self, msg: Submit) -> None:
        if msg.rid in self.finished or msg.rid in self.requests:
            return
        try:
            rid = self.engine.add_request(msg.prompt.tolist(), msg.params, rid=msg.rid)
        except (RequestTooLarge, ValueError) as exc:
            self._fail(msg.rid, str(exc), holders=[])
            return
        req = self.requests[rid]
        req.anchors = [0] * self.num_models
        req.anchors[self.model] = len(req.seq)
        req.runnable_since = time.perf_counter()

    def _on_handoff(self, msg: PeerReq) -> None:
        if msg.rid in self.finished:
            return
        now = time.perf_counter()
        req = self.requests.get(msg.rid)
        if req is None:
            if msg.loc != 0 or msg.params is None:
                self._fail(msg.rid, "handoff for a request this engine does not hold", msg.anchors)
                return
            try:
                tokens, prompt_len = msg.tokens.tolist(), msg.prompt_len
                self.engine.add_request(tokens, msg.params, rid=msg.rid, prompt_len=prompt_len)
            except (RequestTooLarge, ValueError) as exc:
                self._fail(msg.rid, str(exc), msg.anchors)
                return
            req = self.requests[msg.rid]
        else:
            if msg.handoff_seq <= req.handoff_seq:
                return  # stale or duplicate
            have = len(req.seq)
            if msg.loc > have:
                self._fail(msg.rid, f"handoff gap: tokens from {msg.loc}, have {have}", msg.anchors)
                return
            req.seq.extend(msg.tokens[have - msg.loc :].tolist())
            req.state = State.RUNNING if req.pages else State.WAITING
        self.stats.handoffs_in += 1
        req.handoff_seq = msg.handoff_seq
        req.anchors = [int(a) for a in msg.anchors]
        req.anchors[self.model] = len(req.seq)
        req.runnable_since = now
        # Handoff latency excludes time the message waited for this engine's step.
        req.handoff_latencies.append(now - max(msg.sent_at, self.step_end))

    def _drop(self, rid: int) -> None:
        """A peer finished the request or the client aborted it: free it here."""
        req = self.requests.get(rid)
        if req is not None:
            self.engine.scheduler.finish(req)
            self._done(req)
        self._remember(rid)

    # -- stepping ---------------------------------------------------------------------
    def step(self) -> bool:
        """Run one forward and apply the policy's routes; False when nothing was runnable."""
        start = time.perf_counter()
        result = self.engine.forward()
        if result is None:
            return False
        forward_end = time.perf_counter()
        self.stats.record_step(result.batch_size, forward_end - start, result.fed)
        self.completed_steps += 1
        if self.counters is not None:
            self.counters.set_steps(self.model, self.completed_steps)
        reqs = result.requests
        view = StepView(result.forward.logits, result.forward.hidden, result.tokens)
        routes = self.policy.route(reqs, view)
        # Handoffs go out before the step's Emits: a peer waiting for work is on the
        # critical path, the front end is not (it orders Emits by position anyway).
        emits: list[Emit] = []
        finished: list[Request] = []
        for req, token, route in zip(reqs, result.tokens, routes, strict=True):
            req.forwards += 1
            self.stats.record_route(route.dst, int(route.commit))
            if route.commit:
                pos = req.num_output
                reason = self.engine.commit(req, [token])
                emits.append(Emit(req.rid, pos, _i32([token]), _u8([self.model]), reason))
                if reason is not FinishReason.NONE:
                    finished.append(req)
                    continue
            elif route.dst == self.model:
                raise AssertionError(f"policy {self.policy.name} dropped a token and stayed")
            if route.dst != self.model:
                self._handoff(req, route.dst)
        for emit in emits:
            self.send(FRONTEND, emit)
        for req in finished:
            self._finish(req)
        self.step_end = time.perf_counter()
        return True

    def _handoff(self, req: Request, dst: int) -> None:
        req.anchors[self.model] = len(req.seq)
        loc = req.anchors[dst]
        req.handoff_seq += 1
        msg = PeerReq(
            rid=req.rid,
            src=self.model,
            dst=dst,
            handoff_seq=req.handoff_seq,
            kind=PeerKind.HANDOFF,
            loc=loc,
            tokens=_i32(req.seq[loc:]),
            prompt_len=req.prompt_len,
            params=req.params if loc == 0 else None,
            extra=b"",
            sent_at=time.perf_counter(),
            anchors=np.asarray(req.anchors, dtype=np.uint32),
        )
        req.anchors[dst] = len(req.seq)
        req.state = State.PENDING
        if not self.pending_kv:
            self.engine.scheduler.drop_kv(req)
        self.stats.handoffs_out += 1
        self.send(dst, msg)

    def _finish(self, req: Request) -> None:
        for j in self._holders(req.anchors):
            req.handoff_seq += 1
            self.send(j, _control(req, self.model, j, PeerKind.FINISH))
        self._done(req)
        self._remember(req.rid)

    def _holders(self, anchors: list[int] | np.ndarray) -> list[int]:
        return [j for j, a in enumerate(anchors) if a > 0 and j != self.model]

    def _fail(self, rid: int, error: str, holders: list[int] | np.ndarray) -> None:
        log.error("request %d failed on engine %d: %s", rid, self.model, error)
        self.send(FRONTEND, Emit(rid, 0, _i32([]), _u8([]), FinishReason.ERROR, error))
        for j in self._holders(holders):
            self.send(
                j,
                PeerReq(
                    rid,
                    self.model,
                    j,
                    0,
                    PeerKind.ABORT,
                    0,
                    _i32([]),
                    0,
                    None,
                    b"",
                    time.perf_counter(),
                    np.zeros(0, np.uint32),
                ),
            )
        self._remember(rid)

    def _done(self, req: Request) -> None:
        holders = sum(1 << j for j, a in enumerate(req.anchors) if a > 0)
        lat = np.asarray(req.handoff_latencies, dtype=np.float32)
        self.send(FRONTEND, Done(req.rid, self.model, req.fed_tokens, req.forwards, holders, lat))

    def _remember(self, rid: int) -> None:
        self.finished[rid] = None
        if len(self.finished) > FINISHED_MEMORY:
            self.finished.popitem(last=False)


def _control(req: Request, src: int, dst: int, kind: PeerKind) -> PeerReq:
    return PeerReq(
        req.rid,
        src,
        dst,
        req.handoff_seq,
        kind,
        0,
        _i32([]),
        req.prompt_len,
        None,
        b"",
        time.perf_counter(),
        np.zeros(0, np.uint32),
    )


def _i32(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def _u8(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.uint8)
