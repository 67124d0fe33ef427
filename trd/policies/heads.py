"""Small learned router heads stored as safetensors (our format).

File format (one `.safetensors` file per head):

    tensors   layers.0.weight (out, in), layers.0.bias (out,), layers.1.weight, ...
    metadata  kind        "citer" | "r2r" | "collm"
              top_k       "<k>": r2r: the top raw logits it reads; citer, collm: the top
                          log-probabilities it reads with the two entropies ("0": h only)
              threshold   the threshold training chose, in the policy's own sense (citer:
                          confidence below it escalates; r2r/collm: score at or above it);
                          used when the config gives none (0.5 on untrained heads)
              small, large, pair, pair_names   the pair it was trained on (trd/policies/
                          pair.py); absent on untrained heads, which fit any pair
              training    JSON: how it was trained (labels, counts, held-out recall/share)

The head is an MLP: Linear, ReLU, Linear, ..., then a sigmoid on the single output.
Inputs: citer and collm read the small model's last hidden state h, and with top_k > 0
concat(h, logit_features(logits, top_k)); r2r reads concat(h, embedding of the sampled
token, top-k logits sorted descending).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

from trd.policies.base import logp_entropy
from trd.policies.glimp import top_entropy
from trd.policies.pair import PairIdentity
from trd.policies.params import PolicyError

KINDS = ("citer", "r2r", "collm")
Layers = list[tuple[torch.Tensor, torch.Tensor]]


FORBIDDEN_LOGP = -1e4  # a feature's value for a token the request's grammar forbids


def logit_features(logits: torch.Tensor, k: int) -> torch.Tensor:
    """(B, V) -> (B, k + 2): the k largest log-probabilities (descending), R-Stitch's
    normalised entropy and GlimpRouter's top-20 entropy. Beside h they give citer and
    collm the scores the entropy rules use, so training can only add to them: on the demo
    pair, heads on h alone rank the small model's bad tokens worse than entropy does
    (docs/quality.md)."""
    logp = torch.log_softmax(logits, dim=-1)
    # Fewer than k tokens a grammar allows: the others read as very unlikely, not -inf.
    top = torch.topk(logp, min(k, logits.shape[-1]), dim=-1).values.clamp(min=FORBIDDEN_LOGP)
    ents = torch.stack([logp_entropy(logp), top_entropy(logits)], dim=-1)
    return torch.cat([top, ents.to(top.dtype)], dim=-1)


def num_logit_features(top_k: int) -> int:
    return top_k + 2 if top_k else 0


class RouterHead:
    def __init__(
        self,
        layers: Layers,
        kind: str,
        top_k: int,
        threshold: float | None = None,
        pair: PairIdentity | None = None,
    ) -> None:
        self.layers, self.kind, self.top_k = layers, kind, top_k
        self.threshold, self.pair = threshold, pair

    @property
    def in_features(self) -> int:
        return self.layers[0][0].shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0][0].dtype

    @property
    def device(self) -> torch.device:
        return self.layers[0][0].device

    def to(self, dtype: torch.dtype, device: torch.device) -> RouterHead:
        moved = [(w.to(device, dtype), b.to(device, dtype)) for w, b in self.layers]
        return RouterHead(moved, self.kind, self.top_k, self.threshold, self.pair)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in) -> (B,) pre-sigmoid outputs."""
        for i, (w, b) in enumerate(self.layers):
            x = torch.nn.functional.linear(x, w, b)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x.squeeze(-1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(B, in) -> (B,) scores in (0, 1)."""
        return torch.sigmoid(self.logits(x))


def _bad(path: Path, reason: str) -> PolicyError:
    return PolicyError(f"policy.head: {str(path)!r}: {reason}")


def load_head(path: Path, kind: str) -> RouterHead:
    try:
        tensors = load_file(path)
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError) as exc:
        raise _bad(path, f"cannot read safetensors ({exc})") from None
    if meta.get("kind") != kind:
        raise _bad(path, f"metadata kind {meta.get('kind')!r}, need {kind!r}")
    n = len([k for k in tensors if k.endswith(".weight")])
    try:
        layers = [(tensors[f"layers.{i}.weight"], tensors[f"layers.{i}.bias"]) for i in range(n)]
    except KeyError as exc:
        raise _bad(path, f"missing tensor {exc}") from None
    if not layers or layers[-1][0].shape[0] != 1:
        raise _bad(path, "the last layer must have one output")
    try:
        threshold = float(meta["threshold"]) if "threshold" in meta else None
        top_k = int(meta.get("top_k", "0"))
    except ValueError as exc:
        raise _bad(path, f"bad metadata ({exc})") from None
    if top_k < 0:
        raise _bad(path, f"metadata top_k {top_k}: the number of logits it reads, at least 0")
    return RouterHead(layers, kind, top_k, threshold, PairIdentity.from_metadata(meta))


def save_head(
    path: Path,
    kind: str,
    layers: Layers,
    top_k: int = 0,
    threshold: float | None = None,
    pair: PairIdentity | None = None,
    training: dict[str, Any] | None = None,
) -> Path:
    """Write a head file; `pair` and `threshold` are what training chose it for."""
    if kind not in KINDS:
        raise ValueError(f"unknown head kind {kind!r} (choose from {KINDS})")
    tensors = {}
    for i, (w, b) in enumerate(layers):
        tensors[f"layers.{i}.weight"] = w.detach().float().contiguous()
        tensors[f"layers.{i}.bias"] = b.detach().float().contiguous()
    meta = {"kind": kind, "top_k": str(top_k)}
    if threshold is not None:
        meta["threshold"] = repr(float(threshold))
    if pair is not None:
        meta |= pair.metadata()
    if training is not None:
        meta["training"] = json.dumps(training, sort_keys=True)
    save_file(tensors, path, metadata=meta)
    return path


def save_random_head(
    path: Path, kind: str, in_features: int, hidden: int, seed: int, top_k: int = 0
) -> Path:
    """A seeded, untrained head: no pair (it fits any), threshold 0.5 (the score's middle);
    for tests, and the baseline trained heads must beat."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [in_features, 1] if kind == "collm" else [in_features, hidden, 1]
    layers = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        w = torch.randn(fan_out, fan_in, generator=gen) * fan_in**-0.5
        layers.append((w, torch.randn(fan_out, generator=gen) * 0.1))
    return save_head(path, kind, layers, top_k, threshold=0.5)
