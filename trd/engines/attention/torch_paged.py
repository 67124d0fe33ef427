"""Attention over the paged KV layout with plain torch ops (the CPU backend).

Decode rows (one new token) are gathered into one padded (B, L) batch and run as a
single SDPA call per layer; extend rows (several new tokens) run one SDPA call each
with a causal mask offset by the tokens already cached.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from trd.engines.attention.base import AttentionBackend, BatchLayout, slot_indices


@dataclass(slots=True)
class _Extend:
    tokens: slice  # rows of the packed batch
    kv_slots: torch.Tensor  # (L,)
    mask: torch.Tensor  # (n, L) bool, True = attend


@dataclass(slots=True)
class _Plan:
    write_slots: torch.Tensor  # (T,) flat slot per new token
    decode_rows: torch.Tensor  # (Bd,) token rows of decode requests
    decode_slots: torch.Tensor  # (Bd * Lmax,) flattened (Bd, Lmax) slots
    decode_mask: torch.Tensor  # (Bd, 1, 1, Lmax)
    extends: list[_Extend]
    only_decode: bool  # every row is a decode: the output needs no scatter


class TorchPagedAttention(AttentionBackend):
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._plan: _Plan | None = None

    def plan(self, layout: BatchLayout) -> None:
        ps = layout.page_size
        write, dec_rows, dec_slots, extends = [], [], [], []
        row = 0
        rows = zip(layout.q_lens, layout.kv_starts, layout.page_tables, strict=True)
        for n, start, table in rows:
            write.append(slot_indices(table, start, start + n, ps))
            if n == 1:
                dec_rows.append(row)
                dec_slots.append(slot_indices(table, 0, start + 1, ps))
            else:
                total = start + n
                q_pos = np.arange(start, total)[:, None]
                mask = np.arange(total)[None, :] <= q_pos
                slots = self._t(slot_indices(table, 0, total, ps))
                extends.append(_Extend(slice(row, row + n), slots, self._t(mask)))
            row += n
        lmax = max((len(s) for s in dec_slots), default=0)
        padded = np.zeros((len(dec_slots), lmax), dtype=np.int64)
        valid = np.zeros((len(dec_slots), lmax), dtype=bool)
        for i, s in enumerate(dec_slots):
            padded[i, : len(s)] = s
            valid[i, : len(s)] = True
        self._plan = _Plan(
            write_slots=self._t(np.concatenate(write)),
            decode_rows=self._t(np.asarray(dec_rows, dtype=np.int64)),
            decode_slots=self._t(padded.reshape(-1)),
            decode_mask=self._t(valid[:, None, None, :]),
            extends=extends,
            only_decode=not extends,
        )

    def _t(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        p = self._plan
        assert p is not None, "plan() must run before attend()"
        kvh, d = k.shape[1], k.shape[2]
        k_flat = kv_cache[0].view(-1, kvh, d)  # (P*page_size, KVH, D)
        v_flat = kv_cache[1].view(-1, kvh, d)
        k_flat.index_copy_(0, p.write_slots, k)
        v_flat.index_copy_(0, p.write_slots, v)
        # index_select, not advanced indexing: several times faster for these gathers.
        if p.only_decode:
            return self._decode(q, k_flat, v_flat, p).squeeze(2)
        out = torch.empty_like(q)
        if len(p.decode_rows):
            out[p.decode_rows] = self._decode(q[p.decode_rows], k_flat, v_flat, p).squeeze(2)
        for e in p.extends:
            qe = q[e.tokens].transpose(0, 1).unsqueeze(0)  # (1, H, n, D)
            ke = k_flat.index_select(0, e.kv_slots).transpose(0, 1).unsqueeze(0)  # (1, KVH, L, D)
            ve = v_flat.index_select(0, e.kv_slots).transpose(0, 1).unsqueeze(0)
            oe = F.scaled_dot_product_attention(qe, ke, ve, attn_mask=e.mask, enable_gqa=True)
            out[e.tokens] = oe.squeeze(0).transpose(0, 1)
        return out

    @staticmethod
    def _decode(
        qd: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, p: _Plan
    ) -> torch.Tensor:
        """Decode rows (Bd, H, D) against their padded KV: (Bd, H, 1, D)."""
        bd, kvh, d = qd.shape[0], k_flat.shape[1], k_flat.shape[2]
        kd = k_flat.index_select(0, p.decode_slots).view(bd, -1, kvh, d).transpose(1, 2)
        vd = v_flat.index_select(0, p.decode_slots).view(bd, -1, kvh, d).transpose(1, 2)
        return F.scaled_dot_product_attention(
            qd.unsqueeze(2), kd, vd, attn_mask=p.decode_mask, enable_gqa=True
        )
