"""Attention backends behind one interface, picked by `make_backend`."""

from __future__ import annotations

import torch

from trd.engines.attention.base import AttentionBackend, BatchLayout
from trd.models.checkpoint import ModelConfig

__all__ = ["AttentionBackend", "BatchLayout", "make_backend"]


def make_backend(
    name: str, device: torch.device, cfg: ModelConfig, dtype: torch.dtype
) -> AttentionBackend:
    """`auto` picks flashinfer on CUDA and the torch backend elsewhere."""
    if name == "auto":
        name = "flashinfer" if device.type == "cuda" else "torch"
    if name == "torch":
        from trd.engines.attention.torch_paged import TorchPagedAttention

        return TorchPagedAttention(device)
    if name == "flashinfer":
        if device.type != "cuda":
            raise ValueError("the flashinfer attention backend needs a CUDA device")
        from trd.engines.attention.flashinfer_paged import FlashInferPagedAttention

        return FlashInferPagedAttention(
            device, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, dtype
        )
    raise ValueError(f"unknown attention backend {name!r} (choose auto, torch or flashinfer)")
