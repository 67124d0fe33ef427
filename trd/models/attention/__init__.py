"""Attention backends behind one interface, picked by `resolve_backend` / `make_backend`."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from trd.engines.buckets import GraphShape
from trd.models.attention.base import AttentionBackend, BatchLayout
from trd.models.attention.support import choose_backend
from trd.models.checkpoint import ModelConfig

__all__ = ["AttentionBackend", "BatchLayout", "make_backend", "resolve_backend"]

log = logging.getLogger(__name__)


def resolve_backend(name: str, device: torch.device, cfg: ModelConfig, dtype: str) -> str:
    """The backend for engine.attention `name` and this model (support.py says which);
    a fallback from `auto` to torch on CUDA is logged with its reason."""
    backend, why = choose_backend(name, str(device), cfg, dtype)
    if backend == "torch" and name == "auto" and device.type == "cuda":
        log.warning("attention runs on the torch backend, slowly: %s", why)
    return backend


def make_backend(
    name: str,
    device: torch.device,
    cfg: ModelConfig,
    dtype: torch.dtype,
    graph: GraphShape | None = None,
    max_pages: int = 0,
    share: AttentionBackend | None = None,
    shapes: Sequence[GraphShape] = (),
) -> AttentionBackend:
    """A backend `name` (already resolved); for a CUDA graph of `graph`'s shape if given,
    with index buffers for `max_pages` pages, sharing `share`'s workspaces; without
    `share`, with workspaces sized for the graphs of `shapes` that will share them."""
    if name == "torch":
        from trd.models.attention.torch_paged import TorchPagedAttention

        return TorchPagedAttention(device)
    from trd.models.attention.flashinfer_paged import FlashInferPagedAttention

    assert share is None or isinstance(share, FlashInferPagedAttention)
    dims = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    return FlashInferPagedAttention(device, dims, dtype, graph, max_pages, share, shapes)
