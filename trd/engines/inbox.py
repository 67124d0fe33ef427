"""Messages into one engine: new requests, handoffs from peers, finishes and aborts.

Exactly-once lives here, below the policy: a handoff is applied only if its
`handoff_seq` is newer than the last one seen for the request and the request is not
finished (`Outbound.finished`), so duplicates, stale copies and late messages change
nothing. A handoff carries the committed tokens from `loc`; the tokens this engine
already holds are checked against it, never appended twice.

A message whose handling raises fails its own request and nothing else.

A request pinned to one model (`routing.model`) is submitted to that model, which serves
it as the entry would. Otherwise a Submit reaches an engine other than the entry only with
`prefill_ahead` on (trd/supervisor/group.py): the prompt is prefilled here at once, at the
lowest rank, so a handoff that comes later finds it cached (`Request.prefill_only`,
trd/engines/scheduler.py).
Nothing about it reaches the client: if it cannot run, it is not run. The Submit and
the request's first handoff come by different links, so the request may be here or
finished first: then the Submit is late and changes nothing (`prefills_late`).
"""

from __future__ import annotations

import logging
import time

from trd.engines.engine import Engine
from trd.engines.outbound import Outbound
from trd.engines.request import Request, State
from trd.engines.scheduler import RequestTooLarge
from trd.engines.stats import EngineStats
from trd.policies.base import RoutingPolicy
from trd.protocol import Abort, Message, PeerKind, PeerReq, Submit

log = logging.getLogger(__name__)


class Inbox:
    def __init__(
        self, engine: Engine, policy: RoutingPolicy, out: Outbound, stats: EngineStats
    ) -> None:
        self.engine, self.policy, self.out, self.stats = engine, policy, out, stats
        self.num_models = engine.spec.num_models
        self.step_end = 0.0  # when this engine's last step ended (set by its router)

    @property
    def requests(self) -> dict[int, Request]:
        return self.engine.scheduler.requests

    def handle(self, msg: Message) -> None:
        if not isinstance(msg, Submit | PeerReq | Abort):
            log.warning("engine %d ignores unexpected %s", self.out.index, type(msg).__name__)
            return
        try:
            if isinstance(msg, Submit):
                self._submit(msg)
            elif isinstance(msg, PeerReq) and msg.kind is PeerKind.HANDOFF:
                self._handoff(msg)
            else:
                self.drop(msg.rid)
        except Exception as exc:  # a bug or bad data: this request fails, the engine serves on
            log.exception("engine %d: handling %s of request %x", self.out.index,
                          type(msg).__name__, msg.rid)  # fmt: skip
            self._fail(msg.rid, f"internal error: {type(exc).__name__}: {exc}")

    def _submit(self, msg: Submit) -> None:
        if msg.rid in self.out.finished or msg.rid in self.requests:
            # Late: counted where it would have been prefilled ahead (a short prompt's
            # Submit behind its handoff had been counted too, one more than the aheads)
            self.stats.prefills_late += self.out.index != 0 and self._keeps(msg)
            return
        if self.out.index != msg.params.routing.model and self.out.index != 0:
            self._prefill_ahead(msg)
            return
        try:
            rid = self.engine.add_request(msg.prompt.tolist(), msg.params, rid=msg.rid)
        except (RequestTooLarge, ValueError) as exc:
            self.out.fail(msg.rid, str(exc), [])
            return
        req = self.requests[rid]
        req.anchors = [0] * self.num_models
        req.anchors[self.out.index] = len(req.seq)
        req.runnable_since = time.perf_counter()
        self._sync_grammar(req)

    def _keeps(self, msg: Submit) -> bool:
        """Whether a prefill ahead of `msg` has something to keep: a cache to keep it in
        and at least one whole block."""
        cache = self.engine.scheduler.cache
        return cache is not None and len(msg.prompt) > cache.page_size

    def _prefill_ahead(self, msg: Submit) -> None:
        if not self._keeps(msg):
            return
        try:
            self.engine.add_request(msg.prompt.tolist(), msg.params, rid=msg.rid)
        except Exception as exc:  # the entry engine answers for the request
            log.debug("engine %d: no prefill ahead of %x: %s", self.out.index, msg.rid, exc)
            return
        req = self.requests[msg.rid]
        req.prefill_only = True
        req.anchors = [0] * self.num_models
        req.runnable_since = time.perf_counter()
        self.stats.prefills_ahead += 1

    def _handoff(self, msg: PeerReq) -> None:
        if msg.rid in self.out.finished:
            return
        now = time.perf_counter()
        req = self.requests.get(msg.rid)
        if req is None:
            if msg.loc != 0 or msg.params is None:
                self.out.fail(msg.rid, "handoff for a request this engine does not hold",
                              msg.anchors.tolist())  # fmt: skip
                return
            try:
                tokens, prompt_len = msg.tokens.tolist(), msg.prompt_len
                self.engine.add_request(tokens, msg.params, rid=msg.rid, prompt_len=prompt_len)
            except (RequestTooLarge, ValueError) as exc:
                self.out.fail(msg.rid, str(exc), msg.anchors.tolist())
                return
            req = self.requests[msg.rid]
        else:
            if msg.handoff_seq <= req.handoff_seq:
                return  # stale or duplicate
            if req.prefill_only:
                self.engine.scheduler.adopt(req, msg.params)
                self.stats.prefills_adopted += 1
            have = len(req.seq)
            if msg.loc > have:
                raise ValueError(f"handoff gap: tokens from {msg.loc}, this engine has {have}")
            overlap = msg.tokens[: have - msg.loc].tolist()
            if overlap != req.seq[msg.loc : msg.loc + len(overlap)]:
                raise ValueError(f"handoff disagrees with the committed tokens from {msg.loc}")
            req.seq.extend(msg.tokens[have - msg.loc :].tolist())
            req.state = State.RUNNING if req.pages else State.WAITING
        req.handoff_seq = msg.handoff_seq
        req.large_tokens, req.share_tau = msg.large, msg.tau
        req.anchors = msg.anchors.tolist()
        req.anchors[self.out.index] = len(req.seq)
        req.runnable_since = now
        # Handoff latency excludes time the message waited for this engine's step.
        latency = now - max(msg.sent_at, self.step_end)
        req.handoff_latencies.append(latency)
        self.stats.record_handoff(latency, req.params.routing.own)
        self.policy.receive(req, msg.extra)
        self._sync_grammar(req)

    def _sync_grammar(self, req: Request) -> None:
        """Bring the request's matcher up to its committed tokens as it arrives."""
        why = self.engine.constraints.sync(req)
        if why is not None:
            self._fail(req.rid, why)

    def drop(self, rid: int) -> None:
        """A peer finished the request or the client aborted it: free it here."""
        req = self.requests.get(rid)
        if req is not None:
            self.engine.scheduler.finish(req)
            if not req.prefill_only:  # the client never hears of a prefill ahead
                self.out.done(req)
        self.out.remember(rid)

    def _fail(self, rid: int, error: str) -> None:
        req = self.requests.get(rid)
        anchors = list(req.anchors) if req is not None else []
        if req is not None:
            self.engine.scheduler.finish(req)
        self.out.fail(rid, error, anchors)
