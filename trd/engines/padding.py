"""Padding a step to a captured graph's shape (`buckets.py` draws the shapes).

Dummy rows start at position 0 and their page table repeats the scratch page (the page
past the allocator's last, owned by no request), so their KV writes land there, never
in a real request's pages. Their logits rows are computed and dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trd.engines.buckets import GraphShape
from trd.models.attention.base import BatchLayout


@dataclass(frozen=True, slots=True)
class PaddedStep:
    layout: BatchLayout  # shape.rows rows; dummies after the real ones
    ids: np.ndarray  # (shape.tokens,) int64 token ids; dummies feed id 0
    positions: np.ndarray  # (shape.tokens,) int64
    last: np.ndarray  # (shape.batch,) int64 index of each logits row's last token


def pad_step(
    layout: BatchLayout, ids: Sequence[int], shape: GraphShape, scratch_page: int
) -> PaddedStep:
    """`layout` + `ids` (one real step) padded to `shape` with dummy rows on `scratch_page`."""
    real = len(layout.q_lens)
    if (
        real > shape.batch
        or max(layout.q_lens, default=1) > shape.q_len
        or len(ids) != layout.num_tokens
    ):
        raise ValueError(f"a step of {layout.q_lens} tokens does not fit graph {shape}")
    dummies = [1] * (shape.batch - real)
    if not shape.is_decode:
        dummies.append(shape.tokens - layout.num_tokens - len(dummies))
    ps = layout.page_size
    padded = BatchLayout(
        q_lens=[*layout.q_lens, *dummies],
        kv_starts=[*layout.kv_starts, *[0] * len(dummies)],
        page_tables=[*layout.page_tables, *[[scratch_page] * -(-m // ps) for m in dummies]],
        page_size=ps,
    )
    spans = zip(padded.kv_starts, padded.q_lens, strict=True)
    positions = np.concatenate([np.arange(s, s + n, dtype=np.int64) for s, n in spans])
    all_ids = np.zeros(shape.tokens, dtype=np.int64)
    all_ids[: len(ids)] = ids
    last = np.cumsum(padded.q_lens, dtype=np.int64)[: shape.batch] - 1
    return PaddedStep(padded, all_ids, positions, last)
