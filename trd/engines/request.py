"""Per-engine request state. Pure Python, no torch.

One logical sequence per request: `seq` = prompt + committed output tokens, the only
truth. This engine has materialised `kv_len` of them in its KV pages; a forward feeds
`seq[kv_len:]` (one token = decode, more = extend; a prompt is just a long extend).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from trd.protocol import FinishReason, SamplingParams


class State(enum.Enum):
    WAITING = "waiting"  # needs a forward here, holds no pages yet or was preempted
    RUNNING = "running"  # needs a forward here, holds pages
    PENDING = "pending"  # handed to a peer: keeps its pages, takes no compute
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Request:
    rid: int
    seq: list[int]
    prompt_len: int
    params: SamplingParams
    arrival: float
    state: State = State.WAITING
    kv_len: int = 0
    pages: list[int] = field(default_factory=list)
    finish: FinishReason = FinishReason.NONE
    fed_tokens: int = 0  # tokens this engine has run through the model for this request
    # Prefix cache: keys of seq's full blocks (seq never changes, so they stay valid),
    # how many of `pages` are in the cache, and whether it looked up its prefix since
    # it last held no KV here.
    block_keys: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    cached_blocks: int = 0
    looked_up: bool = False
    cache_hit: int = 0  # tokens its last lookup matched
    # A prompt this engine prefills before any handoff of its request arrives
    # (`prefill_ahead`): it feeds the prompt's full blocks, samples nothing, ends as cache
    # entries; if the request's handoff comes first, it becomes that request.
    prefill_only: bool = False
    runnable_since: float = 0.0
    # Routing: anchors[j] = how much of `seq` model j holds a copy of, so a handoff
    # carries only the suffix the destination lacks; handoff_seq orders handoffs.
    anchors: list[int] = field(default_factory=list)
    handoff_seq: int = 0
    forwards: int = 0
    handoff_latencies: list[float] = field(default_factory=list)
    policy_state: Any = None  # whatever the routing policy keeps per request
    # The request's own routing (trd/policies/budget.py): output tokens the last model
    # wrote and the threshold the entry model set for a large_share (both travel with each
    # handoff), and the entry model's sorted scores so far (kept there).
    large_tokens: int = 0
    share_tau: float = math.nan
    scores: list[float] = field(default_factory=list)
    grammar: Any = None  # the request's grammar matcher here (trd.engines.constrain)
    # Speculation (trd/engines/speculate.py): how much of `seq` the draft model holds in
    # its KV over this request's pages (0 whenever the pages are dropped).
    draft_kv: int = 0

    @property
    def num_output(self) -> int:
        return len(self.seq) - self.prompt_len

    @property
    def num_unfed(self) -> int:
        return len(self.seq) - self.kv_len

    def check(self) -> None:
        """Neither the KV cache nor any anchor runs ahead of the committed sequence."""
        if not 0 <= self.kv_len <= len(self.seq):
            raise AssertionError(f"request {self.rid}: kv_len {self.kv_len} vs {len(self.seq)}")
        if any(not 0 <= a <= len(self.seq) for a in self.anchors):
            raise AssertionError(f"request {self.rid}: anchors {self.anchors} vs {len(self.seq)}")
