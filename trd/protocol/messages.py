"""Messages exchanged between the front end and the engines (the codec is in `codec`).

Every message is a slotted dataclass; `Message` is their union.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

MAX_EXTRA = 64 * 1024  # bytes of policy-defined data a PeerReq may carry
MAX_LOGPROBS = 20  # alternatives per token a request may ask for (vLLM's default limit)


class ProtocolError(ValueError):
    """A frame that cannot be decoded, or a message that cannot be encoded."""


class FinishReason(IntEnum):
    NONE = 0
    STOP = 1  # eos or a stop token
    LENGTH = 2  # max_tokens reached
    ABORT = 3
    ERROR = 4


class PeerKind(IntEnum):
    HANDOFF = 1
    FINISH = 2
    ABORT = 3


# A temperature below this samples greedily, as vLLM does: dividing the logits by it would
# overflow. The front end sends such a temperature as 0; the sampler applies the same cut.
GREEDY_BELOW = 1e-5


MAX_MODELS = 255  # models of one daemon: a model index fits a byte, 255 meaning none


@dataclass(slots=True, frozen=True)
class RoutingParams:
    """How one request is routed, when it says (the front end's `routing` field): at most one
    of its own share of large-model tokens, its own threshold, or one model for every token.
    None of them: the daemon's policy and threshold, as for every other request."""

    large_share: float | None = None  # the last model's share of the output, in (0, 1)
    threshold: float | None = None  # the policy's threshold, for this request only
    model: int | None = None  # index of the model that writes every token

    def __post_init__(self) -> None:
        given = [k for k in ("large_share", "threshold", "model") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"routing takes one of large_share, threshold, model; got {given}")
        s, t, m = self.large_share, self.threshold, self.model
        if s is not None and not 0 < s < 1:
            raise ValueError(f"routing.large_share must be in (0, 1), got {s!r}")
        if t is not None and not (math.isfinite(t) and t >= 0):
            raise ValueError(f"routing.threshold must be a finite number >= 0, got {t!r}")
        if m is not None and not 0 <= m < MAX_MODELS:
            raise ValueError(f"routing.model must be a model index below {MAX_MODELS}, got {m!r}")

    @property
    def own(self) -> bool:
        """The request decides for itself (the daemon's share control leaves it out)."""
        return self != NO_ROUTING


NO_ROUTING = RoutingParams()


@dataclass(slots=True, frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None  # None = unseeded
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0  # eos and stop ids cannot end the output before this many tokens
    # None: no log-probabilities; k: each output token's, and its k most likely alternatives
    logprobs: int | None = None
    # "" = unconstrained; else an llguidance grammar (trd.grammar.compile builds it) that
    # every output token must follow
    grammar: str = ""
    # How the request is served rather than sampled; on the wire with the rest, so every
    # engine the request reaches has them: its routing, and its place in every engine's
    # queue (vLLM's priority: lower first; ties by arrival).
    routing: RoutingParams = NO_ROUTING
    priority: int = 0

    def __post_init__(self) -> None:
        if not self.max_tokens >= 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens!r}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not self.top_k >= 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k!r}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(
                f"logprobs must be None or in [0, {MAX_LOGPROBS}], got {self.logprobs!r}"
            )
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be None or in [0, 2**63), got {self.seed!r}")
        if not -(2**31) <= self.priority < 2**31:
            raise ValueError(f"priority must be in [-2**31, 2**31), got {self.priority!r}")
        # Token ids travel as int32 on the wire.
        ids = self.stop_token_ids
        if ids and not (min(ids) >= 0 and max(ids) < 2**31):
            raise ValueError(f"stop_token_ids must be in [0, 2**31), got {self.stop_token_ids!r}")


@dataclass(slots=True)
class Submit:
    """Front end -> entry engine: a new request."""

    rid: int
    prompt: np.ndarray  # int32 token ids, len >= 1
    params: SamplingParams


@dataclass(slots=True)
class PeerReq:
    """Engine -> engine: a handoff, finish or abort of one request."""

    rid: int
    handoff_seq: int  # strictly increasing per request; stale or duplicate ones are ignored
    kind: PeerKind
    loc: int  # position in the full sequence (prompt + output) where `tokens` starts
    tokens: np.ndarray  # int32: the suffix the receiver has not materialised
    prompt_len: int
    params: SamplingParams | None  # present on a request's first arrival at the receiver
    extra: bytes  # policy-defined, <= MAX_EXTRA bytes
    sent_at: float  # time.perf_counter() at send, for handoff latency stats
    anchors: np.ndarray  # uint32, one per model (<= 255): committed tokens model j holds
    # The request's routing state, which its next model reads (trd/policies/budget.py): the
    # output tokens the last model committed so far, and the threshold the request's own
    # share control set on the entry model (NaN: none).
    large: int = 0
    tau: float = field(default=math.nan)

    @classmethod
    def control(cls, kind: PeerKind, rid: int, handoff_seq: int) -> PeerReq:
        """A FINISH or ABORT: no tokens, nothing to commit."""
        empty = np.zeros(0, np.int32)
        return cls(rid, handoff_seq, kind, 0, empty, 0, None, b"", 0.0, np.zeros(0, np.uint32))


@dataclass(slots=True)
class Emit:
    """Engine -> front end: committed output tokens of one request."""

    rid: int
    pos: int  # output position of tokens[0] (0 = first generated token)
    tokens: np.ndarray  # int32
    models: np.ndarray  # uint8, producing model per token
    finish: FinishReason  # NONE while running
    error: str = ""  # set when finish == ERROR
    # Asked with SamplingParams.logprobs = k: per token its log-probability under the model
    # that produced it (float32, n) and that model's k most likely tokens, row by row
    # (int32 and float32, n * k); None when not asked.
    logprobs: np.ndarray | None = None
    top_ids: np.ndarray | None = None
    top_logprobs: np.ndarray | None = None


@dataclass(slots=True)
class Abort:
    """Front end -> engine: the client went away."""

    rid: int


@dataclass(slots=True)
class Ready:
    """Engine -> front end, once after the model is loaded."""

    model: int
    pid: int
    kv_pages: int
    page_size: int
    error: str = ""  # non-empty: the engine failed to start, and why


@dataclass(slots=True)
class Done:
    """Engine -> front end: the engine freed a request; its per-request stats."""

    rid: int
    model: int  # the engine reporting
    fed_tokens: int  # tokens this engine ran through its model for the request
    forwards: int  # forwards that produced a candidate for it on this engine
    holders: int  # bitmask of models that held the request (bit j = model j)
    handoff_latencies: np.ndarray  # float32 seconds, one per handoff this engine received


@dataclass(slots=True)
class Stats:
    """Engine -> front end, periodically: a JSON object of counters and live estimates."""

    model: int
    body: str


@dataclass(slots=True)
class Control:
    """Front end -> engine: a JSON command (e.g. new delayed-batching thresholds)."""

    body: str


Message = Submit | PeerReq | Emit | Abort | Ready | Done | Stats | Control
