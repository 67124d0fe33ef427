"""CUDA-graph buckets: which captured shape a step fits, and the padded step that fills it.

A graph replays the kernels it captured on the buffers it captured them with, so every
replay of a graph has its capture's shape:

    decode graph (b, 1)   b rows of 1 token        B real rows, then b - B dummy rows
    extend graph (b, t)   b + 1 rows,              B real rows of <= t tokens each, dummy
                          b * t + 1 tokens         rows of 1 token up to row b, and a last
                                                   dummy row holding the tokens left over

A step of B rows feeding at most n tokens each fits the smallest decode bucket b >= B
when n == 1, else the (b, t) with b >= B, t >= n and the fewest tokens; when nothing
fits it runs eagerly. The last extend row always has >= 1 token, so the row count is
fixed even when every real row is full.

    real rows            dummy rows
    | r0 | r1 | r2 |     | d | d | d ........ |     tokens of an extend graph (b=4, t=4)
    logits rows: one per row but the last (b of them), real rows first

The padding itself is `padding.py`. Pure Python (the supervisor sizes the memory plan
from these shapes without importing torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class GraphShape:
    batch: int  # b: request rows (and logits rows)
    q_len: int  # t: new tokens per request at most; 1 = a decode graph

    @property
    def is_decode(self) -> bool:
        return self.q_len == 1

    @property
    def rows(self) -> int:
        """Attention rows: the extend graph's slack row comes on top of b."""
        return self.batch if self.is_decode else self.batch + 1

    @property
    def tokens(self) -> int:
        return self.batch if self.is_decode else self.batch * self.q_len + 1


def graph_shapes(batch_sizes: Sequence[int], extend_lens: Sequence[int]) -> list[GraphShape]:
    """Every shape to capture, largest first (later captures reuse the first one's pool)."""
    shapes = [GraphShape(b, t) for b in batch_sizes for t in (1, *extend_lens)]
    return sorted(set(shapes), key=lambda s: (s.tokens, s.batch), reverse=True)


def pick_shape(q_lens: Sequence[int], shapes: Sequence[GraphShape]) -> GraphShape | None:
    """The captured shape with the fewest tokens that holds this step; None: run eagerly."""
    n, rows = max(q_lens), len(q_lens)
    fits = [s for s in shapes if s.batch >= rows and (s.q_len >= n if n > 1 else s.is_decode)]
    return min(fits, key=lambda s: (s.tokens, s.batch), default=None)
