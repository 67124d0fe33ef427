"""Token sampling: greedy, temperature, top-k, top-p, with counter-based randomness.

A sampled request draws its uniform number from (seed, position) alone, so the same
seed gives the same tokens whatever else is in the batch, on whichever engine the
position happens to be sampled (routing moves requests between engines).

Any accepted temperature is safe: below GREEDY_BELOW a request is greedy (dividing by
1e-45 overflows float32 logits to inf, and softmax of inf is NaN), sampling math runs in
float32 or wider whatever the logits' dtype, and the index drawn is clamped into the
kept tokens, so no row can index with -1.

`sample_tensor` leaves the tokens on the logits' device (the engine copies them to the
host once per step, with the routes); its per-row parameters travel to a GPU from
pinned memory, so sampling never waits for the forward to finish.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trd.protocol import GREEDY_BELOW, SamplingParams
from trd.rng import uniform


def ban_early_stops(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    outputs: Sequence[int],
    eos_ids: Sequence[int],
) -> bool:
    """In place: rows with fewer than min_tokens outputs cannot pick eos or a stop id.
    True when a logit was changed (a precomputed argmax is then stale)."""
    changed = False
    for row, (p, n) in enumerate(zip(params, outputs, strict=True)):
        if n < p.min_tokens:
            banned = [t for t in (*p.stop_token_ids, *([] if p.ignore_eos else eos_ids))
                      if t < logits.shape[-1]]  # fmt: skip
            logits[row, banned] = -torch.inf
            changed = changed or bool(banned)
    return changed


def _on(device: torch.device, values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams], positions: Sequence[int]
) -> list[int]:
    """Pick one token per row of logits (B, V); `positions` index the token being made."""
    return sample_tensor(logits, params, positions).tolist()  # type: ignore[no-any-return]


def sample_tensor(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    positions: Sequence[int],
    greedy: torch.Tensor | None = None,
) -> torch.Tensor:
    """`sample` on the device: (B,) long; `greedy` is the logits' argmax when known."""
    tokens = torch.argmax(logits, dim=-1) if greedy is None else greedy.clone()
    rows = [i for i, p in enumerate(params) if p.temperature >= GREEDY_BELOW]
    if rows:
        index = _on(logits.device, rows, torch.long)
        tokens[index] = _sample_rows(
            logits[index], [params[i] for i in rows], [positions[i] for i in rows]
        )
    return tokens


def _sample_rows(
    logits: torch.Tensor, params: list[SamplingParams], positions: list[int]
) -> torch.Tensor:
    # float32 at least: logits / 1e-4 overflows float16 (max 65504) to inf, and softmax of
    # inf is NaN; bfloat16's 8-bit mantissa would also round the top-p cumulative sums.
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    dev = logits.device
    temp = _on(dev, [p.temperature for p in params], logits.dtype)
    probs = torch.softmax(logits / temp[:, None], dim=-1)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    rank = torch.arange(probs.shape[-1], device=dev)[None, :]
    top_k = _on(dev, [p.top_k or probs.shape[-1] for p in params], torch.long)
    top_p = _on(dev, [p.top_p for p in params], logits.dtype)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly above each token
    # The most likely token always stays: a top_p below the logits dtype's smallest
    # number rounds to 0 and would keep nothing (and the gather below would crash).
    keep = ((rank < top_k[:, None]) & (before < top_p[:, None])) | (rank == 0)
    kept = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
    cum = torch.cumsum(kept, dim=-1)
    u = _on(dev, [uniform(p.seed or 0, pos) for p, pos in zip(params, positions, strict=True)],
            cum.dtype)  # fmt: skip
    target = (u * cum[:, -1])[:, None]
    idx = torch.searchsorted(cum, target, right=True).clamp_(max=probs.shape[-1] - 1)
    # `right=True` can land on a zero-probability tail entry only through rounding;
    # clamp to the last kept rank so a masked token is never chosen.
    idx = torch.minimum(idx, (keep.sum(-1, keepdim=True) - 1).clamp_(min=0))
    return order.gather(-1, idx).squeeze(-1)
