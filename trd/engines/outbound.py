"""What one engine sends about its requests, and its memory of the ones it let go.

    to the front end   Emit (committed tokens, or the error that ended a request), Done
    to a peer          PeerReq HANDOFF (the suffix the peer lacks), FINISH, ABORT

`finished` remembers (boundedly) every request this engine finished, failed or was told
to drop, so a late or duplicated message about it is ignored and it is never revived.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from trd.engines.request import Request
from trd.engines.step import TokenLogprobs
from trd.ipc.names import FRONTEND
from trd.protocol import Done, Emit, FinishReason, Message, PeerKind, PeerReq

log = logging.getLogger(__name__)
# A message about a finished request can only lag behind its finish by what is in flight
# on the rings at that moment (each ring is FIFO): a few per request in flight, far fewer
# than this many later finishes.
FINISHED_MEMORY = 4096
Send = Callable[[int, Message], None]


class PeerGone(RuntimeError):
    """A message could not be delivered: its receiver is gone."""


class Outbound:
    def __init__(self, index: int, send: Send) -> None:
        self.index = index
        self.send = send  # raises PeerGone when the receiver is gone
        self.finished: OrderedDict[int, None] = OrderedDict()

    def emit(
        self,
        req: Request,
        pos: int,
        tokens: list[int],
        reason: FinishReason,
        lp: TokenLogprobs | None = None,
    ) -> Emit:
        """Committed tokens from output position `pos` on (log-probabilities: one token's)."""
        msg = Emit(req.rid, pos, _i32(tokens), _u8([self.index] * len(tokens)), reason)
        if lp is not None:
            msg.logprobs = np.asarray([lp.logprob], np.float32)
            msg.top_ids = _i32(lp.top_ids)
            msg.top_logprobs = np.asarray(lp.top_logprobs, np.float32)
        return msg

    def handoff(self, req: Request, dst: int, extra: bytes) -> None:
        """Send `req` to `dst` with what `dst` has not seen; raises PeerGone."""
        req.anchors[self.index] = len(req.seq)
        loc = req.anchors[dst]
        req.handoff_seq += 1
        msg = PeerReq(
            req.rid, req.handoff_seq, PeerKind.HANDOFF, loc, _i32(req.seq[loc:]), req.prompt_len,
            req.params if loc == 0 else None, extra, time.perf_counter(),
            np.asarray(req.anchors, dtype=np.uint32), req.large_tokens, req.share_tau,
        )  # fmt: skip
        req.anchors[dst] = len(req.seq)
        self.send(dst, msg)

    def finish(self, req: Request) -> None:
        """The request ended here: every peer holding it frees it, the front end learns."""
        for j in self.holders(req.anchors):
            req.handoff_seq += 1
            self._to_peer(j, PeerReq.control(PeerKind.FINISH, req.rid, req.handoff_seq))
        self.done(req)
        self.remember(req.rid)

    def fail(self, rid: int, error: str, anchors: Sequence[int]) -> None:
        """The request cannot go on: an error to its client, ABORT to every holder."""
        log.error("request %x failed on engine %d: %s", rid, self.index, error)
        self.send(FRONTEND, Emit(rid, 0, _i32([]), _u8([]), FinishReason.ERROR, error))
        for j in self.holders(anchors):
            self._to_peer(j, PeerReq.control(PeerKind.ABORT, rid, 0))
        self.remember(rid)

    def done(self, req: Request) -> None:
        holders = sum(1 << j for j, a in enumerate(req.anchors) if a > 0)
        lat = np.asarray(req.handoff_latencies, dtype=np.float32)
        self.send(FRONTEND, Done(req.rid, self.index, req.fed_tokens, req.forwards, holders, lat))

    def holders(self, anchors: Sequence[int]) -> list[int]:
        return [j for j, a in enumerate(anchors) if a > 0 and j != self.index]

    def remember(self, rid: int) -> None:
        self.finished[rid] = None
        if len(self.finished) > FINISHED_MEMORY:
            self.finished.popitem(last=False)

    def _to_peer(self, node: int, msg: PeerReq) -> None:
        with contextlib.suppress(PeerGone):  # a dead peer holds nothing any more
            self.send(node, msg)


def _i32(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def _u8(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=np.uint8)
