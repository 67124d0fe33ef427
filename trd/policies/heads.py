"""Small learned router heads stored as safetensors.

File format (one `.safetensors` file per head):

    tensors   layers.0.weight (out, in), layers.0.bias (out,), layers.1.weight, ...
    metadata  {"kind": "citer" | "r2r" | "collm", "top_k": "<k>" (r2r only)}

The head is an MLP: Linear, ReLU, Linear, ..., then a sigmoid on the single output.
Inputs: citer and collm read the small model's last hidden state h; r2r reads
concat(h, embedding of the sampled token, top-k logits sorted descending).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

KINDS = ("citer", "r2r", "collm")


class RouterHead:
    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]], kind: str, top_k: int):
        self.layers, self.kind, self.top_k = layers, kind, top_k

    @property
    def in_features(self) -> int:
        return self.layers[0][0].shape[1]

    def to(self, dtype: torch.dtype, device: torch.device) -> RouterHead:
        moved = [(w.to(device, dtype), b.to(device, dtype)) for w, b in self.layers]
        return RouterHead(moved, self.kind, self.top_k)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in) -> (B,) scores in (0, 1)."""
        for i, (w, b) in enumerate(self.layers):
            x = torch.nn.functional.linear(x, w, b)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return torch.sigmoid(x.squeeze(-1))


def load_head(path: Path, kind: str) -> RouterHead:
    try:
        tensors = load_file(path)
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"router head {path}: cannot read safetensors ({exc})") from None
    if meta.get("kind") != kind:
        raise ValueError(f"router head {path}: metadata kind {meta.get('kind')!r}, need {kind!r}")
    n = len([k for k in tensors if k.endswith(".weight")])
    try:
        layers = [(tensors[f"layers.{i}.weight"], tensors[f"layers.{i}.bias"]) for i in range(n)]
    except KeyError as exc:
        raise ValueError(f"router head {path}: missing tensor {exc}") from None
    if not layers or layers[-1][0].shape[0] != 1:
        raise ValueError(f"router head {path}: the last layer must have one output")
    return RouterHead(layers, kind, int(meta.get("top_k", "0")))


def save_random_head(
    path: Path, kind: str, in_features: int, hidden: int, seed: int, top_k: int = 0
) -> Path:
    """A seeded, untrained head (for tests and demos until heads are trained)."""
    if kind not in KINDS:
        raise ValueError(f"unknown head kind {kind!r} (choose from {KINDS})")
    gen = torch.Generator().manual_seed(seed)
    sizes = [in_features, 1] if kind == "collm" else [in_features, hidden, 1]
    tensors = {}
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
        scale = fan_in**-0.5
        tensors[f"layers.{i}.weight"] = torch.randn(fan_out, fan_in, generator=gen) * scale
        tensors[f"layers.{i}.bias"] = torch.randn(fan_out, generator=gen) * 0.1
    save_file(tensors, path, metadata={"kind": kind, "top_k": str(top_k)})
    return path
