"""The attention backend interface: paged KV writes plus attention for a packed batch.

KV cache layout per layer (shared by every backend, flashinfer's "NHD" layout):

    cache[0] = K pages  (num_pages, page_size, num_kv_heads, head_dim)
    cache[1] = V pages  (num_pages, page_size, num_kv_heads, head_dim)

A request's page table lists its pages in order; token position p lives in page
`table[p // page_size]` at slot `p % page_size`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch


def slot_indices(table: list[int], start: int, stop: int, page_size: int) -> np.ndarray:
    """Flat KV slots (page * page_size + offset) of positions start..stop-1."""
    pos = np.arange(start, stop)
    return np.asarray(table, dtype=np.int64)[pos // page_size] * page_size + pos % page_size


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """Where each request's new tokens sit in the packed batch and in the KV pages."""

    q_lens: list[int]  # new tokens per request (>= 1)
    kv_starts: list[int]  # tokens already cached per request = position of its first new token
    page_tables: list[list[int]]
    page_size: int
    # Per request, the position of its first output token (its prompt's length), where
    # known: a feed of output tokens only (a decode, a handoff's suffix) may be attended
    # token by token (TorchPagedAttention with `native`)
    outputs_from: list[int] | None = None

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)


class AttentionBackend(ABC):
    """Plans once per step, then attends once per layer with the same plan."""

    @abstractmethod
    def plan(self, layout: BatchLayout) -> None:
        """Prepare indices/metadata for this step's batch."""

    @abstractmethod
    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        """Write k/v (T, KVH, D) into the layer's pages, attend causally, return (T, H, D)."""
