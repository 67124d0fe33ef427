"""The CPU attention backend against dense attention, for every kind of row it plans:
short decodes (padded batch), long decodes and extends over one contiguous run of pages
(viewed) or over scattered pages (gathered), all in one step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trd.models.attention.base import BatchLayout
from trd.models.attention.torch_paged import BATCH_BELOW_TOKENS, TorchPagedAttention, kv_slots

H, KVH, D, PS, PAGES = 4, 2, 8, 4, 1024


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Causal attention of q (n, H, D) at positions start.. over k, v (start + n, KVH, D)."""
    rep = H // KVH
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q, k) / math.sqrt(D)
    pos = torch.arange(start, start + len(q))[:, None]
    scores = scores.masked_fill(torch.arange(len(k))[None, :] > pos, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v)


# (new tokens, cached tokens, pages contiguous?)
ROWS = [
    (1, 9, True),  # short decode: the padded batch
    (1, BATCH_BELOW_TOKENS + 40, True),  # long decode over a view
    (1, BATCH_BELOW_TOKENS + 3, False),  # long decode, scattered pages: gathered
    (5, 0, True),  # prefill
    (3, 21, False),  # extend over scattered pages
    (1, 2, False),  # short decode, scattered
    (4, BATCH_BELOW_TOKENS * 2, True),  # long extend over a view
]


def cuda_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """SDPA's output as CUDA's fused kernels return it: (B, H, L, D) values stored as
    (B, L, H, D), so not viewable as one (B, H*L, D) block. The first device run found
    the backend's `.view` of it failing there; on the CPU SDPA returns it contiguous."""
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def strided(*args: object, **kwargs: object) -> torch.Tensor:
        out = sdpa(*args, **kwargs)  # type: ignore[arg-type]
        return out.transpose(1, 2).contiguous().transpose(1, 2)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", strided)


@pytest.mark.parametrize("sdpa_out", ["cpu", "cuda"])
@pytest.mark.parametrize("order", [0, 1, 2])
def test_every_row_kind_matches_dense_attention(
    order: int, sdpa_out: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if sdpa_out == "cuda":
        cuda_layout(monkeypatch)
    torch.manual_seed(order)
    rng = np.random.default_rng(order)
    rows = ROWS[order:] + ROWS[:order]
    free = list(rng.permutation(PAGES))
    cache = torch.randn(2, PAGES, PS, KVH, D, dtype=torch.float64)
    tables, history = [], []
    next_run = 0
    for n, start, contiguous in rows:
        count = -(-(start + n) // PS)
        if contiguous:
            table = list(range(next_run, next_run + count))
            next_run += count + 1
        else:
            table = [p for p in free if p >= 400][:count]  # random pages above the runs
            free = [p for p in free if p not in table]
        tables.append(table)
        history.append(cache[:, table].reshape(2, -1, KVH, D)[:, :start].clone())
    layout = BatchLayout([r[0] for r in rows], [r[1] for r in rows], tables, PS)
    total = layout.num_tokens
    q = torch.randn(total, H, D, dtype=torch.float64)
    k, v = torch.randn(total, KVH, D, dtype=torch.float64), torch.randn_like(q[:, :KVH])
    backend = TorchPagedAttention(torch.device("cpu"))
    backend.plan(layout)
    out = backend.attend(q, k, v, cache)
    row = 0
    for (n, start, _), table, past in zip(rows, tables, history, strict=True):
        keys = torch.cat([past[0], k[row : row + n]])
        values = torch.cat([past[1], v[row : row + n]])
        want = dense(q[row : row + n], keys, values, start)
        torch.testing.assert_close(out[row : row + n], want, rtol=1e-10, atol=1e-10)
        stored = cache[:, table].reshape(2, -1, KVH, D)[:, : start + n]
        torch.testing.assert_close(stored[0], keys, rtol=0, atol=0)
        torch.testing.assert_close(stored[1], values, rtol=0, atol=0)
        row += n


def test_consecutive_pages_are_viewed_and_scattered_ones_listed() -> None:
    assert kv_slots([7, 8, 9], 10, 4) == slice(28, 38)
    assert kv_slots([7, 8, 3], 8, 4) == slice(28, 36)  # page 3 holds no position < 8
    listed = kv_slots([7, 9], 6, 4)
    assert isinstance(listed, np.ndarray)
    assert listed.tolist() == [28, 29, 30, 31, 36, 37]
