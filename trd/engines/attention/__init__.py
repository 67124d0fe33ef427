"""Attention backends behind one interface, picked by `resolve_backend` / `make_backend`."""

from __future__ import annotations

import importlib.util
import logging

import torch

from trd.engines.attention.base import AttentionBackend, BatchLayout
from trd.engines.buckets import GraphShape
from trd.models.checkpoint import ModelConfig

__all__ = ["AttentionBackend", "BatchLayout", "make_backend", "resolve_backend"]

log = logging.getLogger(__name__)


def resolve_backend(name: str, device: torch.device) -> str:
    """`auto`: flashinfer on CUDA when it is installed (else torch, with a warning), torch
    elsewhere. The dtype was checked against flashinfer's when the spec was built."""
    if name not in ("auto", "torch", "flashinfer"):
        raise ValueError(f"unknown attention backend {name!r} (choose auto, torch or flashinfer)")
    if name == "flashinfer" and device.type != "cuda":
        raise ValueError("engine.attention: flashinfer: the flashinfer backend needs a CUDA device")
    if name != "auto":
        return name
    if device.type != "cuda":
        return "torch"
    if importlib.util.find_spec("flashinfer") is None:
        log.warning("flashinfer is not installed: attention runs on the torch backend, slowly "
                    "(pip install 'tokenrouterd[gpu]')")  # fmt: skip
        return "torch"
    return "flashinfer"


def make_backend(
    name: str,
    device: torch.device,
    cfg: ModelConfig,
    dtype: torch.dtype,
    graph: GraphShape | None = None,
    max_pages: int = 0,
    share: AttentionBackend | None = None,
) -> AttentionBackend:
    """A backend `name` (already resolved); for a CUDA graph of `graph`'s shape if given,
    with index buffers for `max_pages` pages, sharing `share`'s workspaces."""
    if name == "torch":
        from trd.engines.attention.torch_paged import TorchPagedAttention

        return TorchPagedAttention(device)
    from trd.engines.attention.flashinfer_paged import FlashInferPagedAttention

    assert share is None or isinstance(share, FlashInferPagedAttention)
    dims = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    return FlashInferPagedAttention(device, dims, dtype, graph, max_pages, share)
