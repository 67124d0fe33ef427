"""One model's routing runtime: a forward, the policy's routes, commits, handoffs.

    inbox.handle(msg)       messages in (exactly-once, in `inbox.py`)
    launch.delay(now, ...)  launch now? (delayed batching, in `launch.py`)
    step()                  forward -> policy.route -> commit / Emit / handoff / finish

`RoutingEngine` does not know about processes or rings: it sends through a
`send(node, msg)` callable, so tests wire engines together in one process.

Exactly-once commits: a request is active on exactly one engine at a time and only that
engine commits. A request whose handling fails in a step fails alone (an error to its
client, its pages freed, ABORT to its peers); the others in the batch go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from trd.engines.engine import Engine
from trd.engines.inbox import Inbox
from trd.engines.launch import LaunchRule, make_launch_rule
from trd.engines.outbound import Outbound, PeerGone, Send
from trd.engines.request import Request, State
from trd.engines.spec import EngineSpec
from trd.engines.speculate import Verified
from trd.engines.stats import EngineStats
from trd.engines.step import StepResult, TokenLogprobs
from trd.engines.threads import ThreadShare
from trd.ipc.counters import Counters
from trd.ipc.names import FRONTEND
from trd.policies.base import Route, RouteBatch, RoutingPolicy, host_routes, pinned
from trd.protocol import Emit, FinishReason

log = logging.getLogger(__name__)


class RoutingEngine:
    def __init__(
        self,
        engine: Engine,
        policy: RoutingPolicy,
        send: Send,
        counters: Counters | None = None,
    ) -> None:
        spec: EngineSpec = engine.spec
        self.engine, self.policy, self.index = engine, policy, spec.index
        self.last = spec.num_models - 1
        self.stats = EngineStats()
        self.out = Outbound(spec.index, send)
        self.inbox = Inbox(engine, policy, self.out, self.stats)
        self.launch: LaunchRule = make_launch_rule(spec, counters)
        self.threads = ThreadShare(
            spec.index, spec.threads, spec.threads_alone, spec.host_peers, counters
        )
        # A request that leaves keeps its pages, its full blocks shared from now on (the
        # cache); the ablation without pending KV frees them (still cached, if on).
        sched = engine.scheduler
        self.leave: Callable[[Request], None] = (
            sched.cache_computed if spec.settings.pending_kv else sched.drop_kv
        )

    @property
    def requests(self) -> dict[int, Request]:
        return self.engine.scheduler.requests

    def expects_return(self) -> bool:
        """Some request of this engine is away at a peer, so a handoff back may come soon."""
        return any(r.state is State.PENDING for r in self.requests.values())

    def launch_delay(self, now: float) -> float:
        return self.launch.delay(now, self.engine.scheduler.runnable())

    def publish_busy(self) -> int:
        """Publish this engine's runnable count for its peers; returns it."""
        runnable = len(self.engine.scheduler.runnable())
        self.launch.publish(runnable)
        return runnable

    # -- stepping ---------------------------------------------------------------------
    def step(self) -> bool:
        """Run one forward and apply the policy's routes; False when nothing was runnable."""
        start = time.perf_counter()
        batch = self.engine.schedule()
        if not batch:
            return False
        verified = self.engine.speculate(batch)
        if verified is not None:
            self._commit_verified(verified, start)
            return True
        result = self.engine.forward(batch)
        if result is None:
            return False
        # The routes are decided on the device; then the step's one copy to the host.
        host = result.resolve(self._routes(result))
        self.stats.record_step(result.batch_size, time.perf_counter() - start, result.fed)
        self.stats.mask_s = self.engine.constraints.mask_s
        self.launch.stepped()
        for req, error in host.failed:
            self._fail(req, error)
        # Handoffs go out before the step's Emits: a peer waiting for work is on the
        # critical path, the front end is not (it orders Emits by position anyway).
        emits: list[Emit] = []
        finished: list[Request] = []
        rows = zip(host.requests, host.tokens, host.routes, host.logprobs, strict=True)
        for req, token, route, lp in rows:
            try:
                self._apply(req, token, route, lp, emits, finished)
            except Exception as exc:
                log.exception("engine %d: routing request %x", self.index, req.rid)
                self._fail(req, f"internal error: {type(exc).__name__}: {exc}")
        self._deliver(emits, finished)
        return True

    def _deliver(self, emits: list[Emit], finished: list[Request]) -> None:
        for emit in emits:
            self.out.send(FRONTEND, emit)
        for req in finished:
            self.out.finish(req)
        self.inbox.step_end = time.perf_counter()

    @torch.inference_mode()  # the step's tensors are inference tensors; no autograd here
    def _routes(self, result: StepResult) -> RouteBatch | list[Route | None]:
        """The policy's routes for every row; if it raises, per request (None = failed)."""
        reqs, view = result.rows, result.view()
        try:
            routes = pinned(reqs, self.policy.route(reqs, view), self.index)
            return routes if isinstance(routes, RouteBatch) else list(routes)
        except Exception:
            log.exception("policy %s failed on a batch of %d", self.policy.name, len(reqs))
        routes_: list[Route | None] = []
        for i, req in enumerate(reqs):
            try:
                routes_.append(
                    host_routes(pinned([req], self.policy.route([req], view.row(i)), self.index))[0]
                )
            except Exception as exc:
                self._fail(req, f"routing policy failed: {type(exc).__name__}: {exc}")
                routes_.append(None)
        return routes_

    def _apply(
        self,
        req: Request,
        token: int,
        route: Route,
        lp: TokenLogprobs | None,
        emits: list[Emit],
        finished: list[Request],
    ) -> None:
        req.forwards += 1
        self.stats.record_route(route.dst, int(route.commit), req.params.routing.own)
        if route.commit:
            pos = req.num_output
            req.large_tokens += self.index == self.last
            reason = self.engine.commit(req, [token])
            emits.append(self.out.emit(req, pos, [token], reason, lp))
            if reason is not FinishReason.NONE:
                finished.append(req)
                return
        elif route.dst == self.index:
            raise AssertionError(f"policy {self.policy.name} dropped a token and stayed")
        if route.dst != self.index:
            self._handoff(req, route.dst)

    def _commit_verified(self, verified: list[Verified], start: float) -> None:
        """A speculative step's tokens (each request stays here: it is pinned or alone)."""
        fed = sum(v.fed for v in verified)
        self.stats.record_step(len(verified), time.perf_counter() - start, fed)
        self.launch.stepped()
        emits: list[Emit] = []
        finished: list[Request] = []
        for v in verified:
            if v.error:
                self._fail(v.req, v.error)
                continue
            try:
                self._apply_verified(v, emits, finished)
            except Exception as exc:
                log.exception("engine %d: committing request %x", self.index, v.req.rid)
                self._fail(v.req, f"internal error: {type(exc).__name__}: {exc}")
        self._deliver(emits, finished)

    def _apply_verified(self, v: Verified, emits: list[Emit], finished: list[Request]) -> None:
        req = v.req
        req.forwards += 1
        pos = req.num_output
        reason = self.engine.commit(req, v.tokens)
        tokens = req.seq[v.base :]
        req.large_tokens += len(tokens) if self.index == self.last else 0
        self.stats.record_route(self.index, len(tokens), req.params.routing.own)
        self.stats.proposed += v.proposed
        self.stats.accepted += len(v.tokens) - 1
        emits.append(self.out.emit(req, pos, tokens, reason))
        if reason is not FinishReason.NONE:
            finished.append(req)

    def _handoff(self, req: Request, dst: int) -> None:
        extra = self.policy.send(req, dst)
        req.state = State.PENDING
        try:
            self.out.handoff(req, dst, extra)
        except PeerGone:
            self._fail(req, f"model {dst} is not reachable: the handoff cannot be delivered")
            return
        self.leave(req)
        self.stats.handoffs_out += 1

    def _fail(self, req: Request, error: str) -> None:
        if req.state is not State.FINISHED:
            self.engine.scheduler.finish(req)
        if req.prefill_only:  # speculative: its request may never come here
            log.warning("engine %d: prefill ahead of %x failed: %s", self.index, req.rid, error)
            return
        self.out.fail(req.rid, error, req.anchors)
