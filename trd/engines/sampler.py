"""Token sampling: greedy, temperature, top-k, top-p, with counter-based randomness.

A sampled request draws its uniform number from (seed, position) alone, so the same
seed gives the same tokens whatever else is in the batch, on whichever engine the
position happens to be sampled (routing moves requests between engines).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trd.protocol import SamplingParams

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, position)."""
    return (_splitmix64(_splitmix64(seed) ^ position) >> 11) * (1.0 / (1 << 53))


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], positions: Sequence[int]
) -> list[int]:
    """Pick one token per row of logits (B, V); `positions` index the token being made."""
    tokens = torch.argmax(logits, dim=-1)
    rows = [i for i, p in enumerate(params) if p.temperature > 0]
    if rows:
        tokens[rows] = _sample_rows(
            logits[rows], [params[i] for i in rows], [positions[i] for i in rows]
        )
    return tokens.tolist()


def _sample_rows(
    logits: torch.Tensor, params: list[SamplingParams], positions: list[int]
) -> torch.Tensor:
    dev = logits.device
    temp = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=dev)
    probs = torch.softmax(logits / temp[:, None], dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    rank = torch.arange(probs.shape[-1], device=dev)[None, :]
    top_k = torch.tensor([p.top_k or probs.shape[-1] for p in params], device=dev)
    top_p = torch.tensor([p.top_p for p in params], dtype=logits.dtype, device=dev)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly above each token
    # The most likely token always stays: a top_p below the logits dtype's smallest
    # number rounds to 0 and would keep nothing (and the gather below would crash).
    keep = ((rank < top_k[:, None]) & (before < top_p[:, None])) | (rank == 0)
    kept = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    cum = torch.cumsum(kept, dim=-1)
    u = torch.tensor(
        [uniform(p.seed or 0, pos) for p, pos in zip(params, positions, strict=True)],
        dtype=cum.dtype,
        device=dev,
    )
    target = (u * cum[:, -1])[:, None]
    idx = torch.searchsorted(cum, target, right=True).clamp_(max=probs.shape[-1] - 1)
    # `right=True` can land on a zero-probability tail entry only through rounding;
    # clamp to the last kept rank so a masked token is never chosen.
    idx = torch.minimum(idx, keep.sum(-1, keepdim=True) - 1)
    return order.gather(-1, idx).squeeze(-1)
