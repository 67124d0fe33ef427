"""Front-end bookkeeping of a request's output: Emits from several engines, in order.

Two engines write to the front end, so Emits of one request can arrive out of order;
tokens are placed by position, duplicates are ignored, and in-order tokens are
released as soon as they are contiguous (that is what streaming sends).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from trd.protocol import Done, Emit, FinishReason


@dataclass(slots=True)
class Tracked:
    rid: int
    slots: dict[int, tuple[int, int]] = field(default_factory=dict)  # pos -> (token, model)
    released: int = 0  # tokens handed out in order so far
    finish: FinishReason = FinishReason.NONE
    length: int | None = None  # total output length, known once the finishing Emit arrives
    error: str = ""
    dones: dict[int, Done] = field(default_factory=dict)
    holders: int = 0
    first_at: float | None = None  # when the first token was released
    done_at: float | None = None  # when the last token was released

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first."""
        if self.first_at is None or self.done_at is None or self.released < 2:
            return None
        return (self.done_at - self.first_at) / (self.released - 1)

    @property
    def complete(self) -> bool:
        return self.finish is not FinishReason.NONE and (
            self.length is None or self.released == self.length
        )

    @property
    def tokens(self) -> list[int]:
        return [self.slots[p][0] for p in range(self.released)]

    @property
    def models(self) -> list[int]:
        return [self.slots[p][1] for p in range(self.released)]

    def on_emit(self, emit: Emit) -> list[tuple[int, int]]:
        """Record an Emit; return the (token, model) pairs now releasable in order."""
        for i, (tok, model) in enumerate(
            zip(emit.tokens.tolist(), emit.models.tolist(), strict=True)
        ):
            self.slots.setdefault(emit.pos + i, (tok, model))
        if emit.finish is not FinishReason.NONE and self.finish is FinishReason.NONE:
            self.finish = emit.finish
            self.error = emit.error
            if emit.finish is not FinishReason.ERROR:
                self.length = emit.pos + len(emit.tokens)
        out = []
        while self.released in self.slots and (self.length is None or self.released < self.length):
            out.append(self.slots[self.released])
            self.released += 1
        now = time.perf_counter()
        if out and self.first_at is None:
            self.first_at = now
        if self.complete and self.done_at is None:
            self.done_at = now
        return out

    def fail(self, error: str) -> None:
        if not self.complete:
            self.finish, self.error, self.length = FinishReason.ERROR, error, None

    def on_done(self, done: Done) -> None:
        self.dones[done.model] = done
        self.holders |= done.holders

    @property
    def all_done(self) -> bool:
        """Every engine that held the request has reported freeing it."""
        return self.holders != 0 and all(
            j in self.dones for j in range(self.holders.bit_length()) if self.holders >> j & 1
        )
