"""One request as the supervisor sees it: its output in order, its timing, how it ended.

Two or more engines write Emits for one request, so they may arrive out of order; each
token is placed by position. A token seen twice at a position is counted as a duplicate
and ignored; a different token at a position already filled is a conflict, which fails
the request (exactly-once broken somewhere must not reach a client silently).

    tokens[:]            contiguous output so far (what a stream may send)
    ahead{pos: ...}      tokens past a gap, waiting for the gap to fill

Memory is bounded by the request's max_tokens. `changed` is set whenever something a
reader waits for happened (new tokens, the end); the HTTP handler awaits it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trd.protocol import Done, Emit, FinishReason


@dataclass(frozen=True, slots=True)
class Logprob:
    """An output token's log-probability under the model that made it, and that model's
    most likely tokens as (id, log-probability), as many as the request asked for."""

    logprob: float
    top: list[tuple[int, float]]


@dataclass(eq=False)
class Generation:
    rid: int
    prompt_len: int
    tokens: list[int] = field(default_factory=list)
    models: list[int] = field(default_factory=list)  # producing model per token
    finish: FinishReason = FinishReason.NONE
    error: str = ""
    error_status: int = 500  # 503: the service could not serve it (restart, drain)
    length: int | None = None  # total output length, once the finishing Emit arrived
    duplicates: int = 0
    dones: dict[int, Done] = field(default_factory=dict)
    holders: int = 0  # bitmask of engines that held the request
    start: float = field(default_factory=time.perf_counter)
    first_at: float | None = None  # first token in order
    done_at: float | None = None  # last token in order, or the failure
    progress_at: float = field(default_factory=time.monotonic)  # last message about it
    ahead: dict[int, tuple[int, int]] = field(default_factory=dict)
    logprobs: dict[int, Logprob] = field(default_factory=dict)  # by output position, if asked
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def complete(self) -> bool:
        """Output final: finished with every token in order, or failed."""
        if self.finish is FinishReason.NONE:
            return False
        return self.length is None or len(self.tokens) == self.length

    @property
    def all_done(self) -> bool:
        """Every engine that held the request has reported freeing it."""
        bits = range(self.holders.bit_length())
        return self.holders != 0 and all(j in self.dones for j in bits if self.holders >> j & 1)

    @property
    def ttft(self) -> float | None:
        return None if self.first_at is None else self.first_at - self.start

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first."""
        if self.first_at is None or self.done_at is None or len(self.tokens) < 2:
            return None
        return (self.done_at - self.first_at) / (len(self.tokens) - 1)

    def on_emit(self, emit: Emit) -> None:
        self.progress_at = time.monotonic()
        for i, (tok, model) in enumerate(
            zip(emit.tokens.tolist(), emit.models.tolist(), strict=True)
        ):
            self._place(emit.pos + i, tok, model)
        if emit.logprobs is not None and emit.top_ids is not None and emit.top_logprobs is not None:
            self._keep_logprobs(emit.pos, emit.logprobs, emit.top_ids, emit.top_logprobs)
        if emit.finish is not FinishReason.NONE and self.finish is FinishReason.NONE:
            if emit.finish is FinishReason.ERROR:
                self.fail(emit.error or "the engine failed the request")
                return
            self.finish, self.length = emit.finish, emit.pos + len(emit.tokens)
        self._release()

    def _place(self, pos: int, tok: int, model: int) -> None:
        have = (
            (self.tokens[pos], self.models[pos]) if pos < len(self.tokens) else self.ahead.get(pos)
        )
        if have is None:
            self.ahead[pos] = (tok, model)
        elif have == (tok, model):
            self.duplicates += 1
        else:
            self.fail(f"conflicting tokens for output position {pos}: {have} and {(tok, model)}")

    def _keep_logprobs(
        self, pos: int, logprobs: np.ndarray, top_ids: np.ndarray, top_logprobs: np.ndarray
    ) -> None:
        n = len(logprobs)
        ids = top_ids.reshape(n, -1).tolist() if n else []
        lps = top_logprobs.reshape(n, -1).tolist() if n else []
        for i, lp in enumerate(logprobs.tolist()):
            self.logprobs.setdefault(pos + i, Logprob(lp, list(zip(ids[i], lps[i], strict=True))))

    def _release(self) -> None:
        before = len(self.tokens)
        while (nxt := self.ahead.pop(len(self.tokens), None)) is not None:
            if self.length is not None and len(self.tokens) >= self.length:
                break
            self.tokens.append(nxt[0])
            self.models.append(nxt[1])
        now = time.perf_counter()
        if len(self.tokens) > before and self.first_at is None:
            self.first_at = now
        if self.complete and self.done_at is None:
            self.done_at = now
        if len(self.tokens) > before or self.complete:
            self.changed.set()

    def on_done(self, done: Done) -> None:
        self.progress_at = time.monotonic()
        self.dones[done.model] = done
        self.holders |= done.holders

    def fail(self, error: str, status: int = 500) -> None:
        """End it with an error (no-op once it is complete)."""
        if self.complete:
            return
        self.finish, self.error, self.error_status, self.length = (
            FinishReason.ERROR, error, status, None,
        )  # fmt: skip
        self.done_at = time.perf_counter()
        self.changed.set()


# A request behind engines that keep working (stepping, or idle and reporting) fails only
# after this many stall limits: a queue of long prefills on a CPU is not a hang.
QUEUED_FACTOR = 10


def cpu_ticks(pid: int) -> int | None:
    """The CPU time (user + system, all threads) a process has used, in clock ticks;
    None where /proc does not tell (the process is gone, or this is not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat


def stalled_requests(
    gens: Iterable[Generation], heard: dict[int, float], now: float, limit_s: float
) -> tuple[float, list[Generation]]:
    """(the wait that applies, the requests without progress for that long): `limit_s`
    while an engine has not been heard from for `limit_s` (hung or stopped), else
    QUEUED_FACTOR x `limit_s` (a request waiting its turn, or one lost)."""
    silent = any(now - t > limit_s for t in heard.values())
    wait = limit_s if silent else QUEUED_FACTOR * limit_s
    return wait, [g for g in gens if not g.complete and now - g.progress_at > wait]
