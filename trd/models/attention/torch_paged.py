"""Attention over the paged KV layout with plain torch ops (the CPU backend).

Decode rows with a short context are gathered into one padded (B, L) batch and run as a
single SDPA call per layer. Every other row (a long decode, or an extend of several
tokens with a causal mask offset by the tokens already cached) runs one SDPA call of
its own over its KV: a view of the cache, without a copy, when its pages are one
contiguous run (the allocator hands pages out in runs), else a gather of its slots.
Gathering is cheap for a few dozen tokens and a copy of the whole context per layer
per step for thousands: at batch 16 and 2048 tokens a view attends ~4x faster.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from trd.models.attention.base import AttentionBackend, BatchLayout, slot_indices
from trd.models.qkernel import Kernel

# Below this context a decode row joins the padded batch: one call for many short rows
# beats a call per row (measured: 16 rows of 32 tokens 0.16 vs 0.37 ms; 128 tokens even).
BATCH_BELOW_TOKENS = 128
# With the native call (quantised float32 engines), a feed of output tokens only (a
# decode, a handoff's suffix: `BatchLayout.outputs_from`) is attended token by token, each
# token to its causal prefix, as a decode row is; so a step of such feeds takes the native
# decoder stack (trd/models/native_stack.py), and a token's bits do not depend on how
# its feed was cut into steps. A routed large model's step is mostly a suffix of 2-4
# tokens: through the modules it cost 48 ms where a one-token step takes 30 (1.5B int4).
# A prompt's tokens keep SDPA (its chunks depend on the load: a short last chunk
# attended otherwise than the rest would make a prompt's bits depend on the load).


@dataclass(slots=True)
class _Row:
    """A request attended on its own."""

    tokens: slice  # rows of the packed batch
    kv: slice | torch.Tensor  # its slots: one contiguous run (viewed) or listed (gathered)
    mask: torch.Tensor | None  # (n, L) bool, True = attend; None for a single new token


@dataclass(slots=True)
class _Plan:
    write_slots: torch.Tensor  # (T,) flat slot per new token
    decode_rows: torch.Tensor  # (Bd,) token rows of the batched decode requests
    decode_slots: torch.Tensor  # (Bd * Lmax,) flattened (Bd, Lmax) slots
    decode_mask: torch.Tensor  # (Bd, 1, 1, Lmax)
    rows: list[_Row]
    # With `native`: the output feeds' token rows, their slot offsets and slots, for the
    # one call.
    native: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


def kv_slots(table: list[int], stop: int, page_size: int) -> slice | np.ndarray:
    """Slots of positions 0..stop-1: a slice when the pages they use are consecutive."""
    used = np.asarray(table[: -(-stop // page_size)], dtype=np.int64)
    if bool(np.all(np.diff(used) == 1)):  # one page: no differences, all true
        first = int(used[0]) * page_size
        return slice(first, first + stop)
    return slot_indices(table, 0, stop, page_size)


class TorchPagedAttention(AttentionBackend):
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._plan: _Plan | None = None
        # Quantised models on the CPU: every output feed's attention in one native call
        # per layer (float32; trd/models/cpu_ops.cpp), set by the runner.
        self.native: Kernel | None = None

    def plan(self, layout: BatchLayout) -> None:
        ps = layout.page_size
        write, dec_rows, dec_slots, rows = [], [], [], []
        # with `native`: every output feed's tokens, in its call
        one_rows: list[int] = []
        one_slots: list[np.ndarray] = []
        row = 0
        # where unknown, every token is taken for a prompt's
        outputs_from: Sequence[float] = layout.outputs_from or [math.inf] * len(layout.q_lens)
        for n, start, table, first in zip(
            layout.q_lens, layout.kv_starts, layout.page_tables, outputs_from, strict=True
        ):
            total = start + n
            write.append(slot_indices(table, start, total, ps))
            outputs = n == 1 or start >= first
            if outputs and self.native is not None:
                prefix = slot_indices(table, 0, total, ps)
                one_rows.extend(range(row, row + n))  # each token to its causal prefix
                one_slots.extend(prefix[: start + i + 1] for i in range(n))
            elif n == 1 and total < BATCH_BELOW_TOKENS:
                dec_rows.append(row)
                dec_slots.append(slot_indices(table, 0, total, ps))
            else:
                slots = kv_slots(table, total, ps)
                kv = slots if isinstance(slots, slice) else self._t(slots)
                mask = None
                if n > 1:
                    mask = self._t(np.arange(total)[None, :] <= np.arange(start, total)[:, None])
                rows.append(_Row(slice(row, row + n), kv, mask))
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
            rows=rows,
            native=self._native_rows(one_rows, one_slots) if one_rows else None,
        )

    def native_decode(self) -> tuple[torch.Tensor, ...] | None:
        """When the planned step's every feed is output tokens (all in the native call):
        its KV write slots, then the native call's rows, offsets and slots (`NativeStack`
        takes them)."""
        p = self._plan
        if p is None or p.native is None or p.rows or len(p.decode_rows):
            return None
        return (p.write_slots, *p.native)

    def _t(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device)

    def _native_rows(
        self, rows: list[int], slots: list[np.ndarray]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The native call's arguments for token `rows`, each attending to its `slots`."""
        offsets = np.cumsum([0, *(len(s) for s in slots)], dtype=np.int64)
        return (self._t(np.asarray(rows, dtype=np.int64)), self._t(offsets),
                self._t(np.concatenate(slots)))  # fmt: skip

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
        if p.native is not None and self.native is not None:  # float32 engines only
            # Every output feed's tokens in the one native call, whatever else the batch holds:
            # a decode row's attention is the same alone, among decodes or beside a
            # prefill (so are its tokens, and the routing decisions they feed).
            out = torch.empty(q.shape, dtype=q.dtype)
            self.native.decode_attention(q, k_flat, v_flat, out, *p.native)
            if not p.rows:
                return out
        elif not p.rows:
            return self._decode(q, k_flat, v_flat, p)
        elif len(p.rows) == 1 and p.rows[0].mask is None and not len(p.decode_rows):
            return self._one(q, k_flat, v_flat, p.rows[0].kv)  # one request, one token
        else:
            out = torch.empty_like(q)
        if len(p.decode_rows):
            out[p.decode_rows] = self._decode(q[p.decode_rows], k_flat, v_flat, p)
        for r in p.rows:
            if r.mask is None:
                out[r.tokens] = self._one(q[r.tokens], k_flat, v_flat, r.kv)
                continue
            if isinstance(r.kv, slice):
                kr, vr = k_flat[r.kv], v_flat[r.kv]
            else:  # index_select, not advanced indexing: several times faster here
                kr, vr = k_flat.index_select(0, r.kv), v_flat.index_select(0, r.kv)
            kr, vr = kr.transpose(0, 1).unsqueeze(0), vr.transpose(0, 1).unsqueeze(0)
            qr = q[r.tokens].transpose(0, 1).unsqueeze(0)  # (1, H, n, D)
            o = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=r.mask, enable_gqa=True)
            out[r.tokens] = o.squeeze(0).transpose(0, 1)
        return out

    @staticmethod
    def _one(
        q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, kv: slice | torch.Tensor
    ) -> torch.Tensor:
        """A single query (1, H, D) against its KV: the heads of a group are its queries."""
        kvh, d = k_flat.shape[1], k_flat.shape[2]
        if isinstance(kv, slice):
            kr, vr = k_flat[kv], v_flat[kv]
        else:  # index_select, not advanced indexing: several times faster here
            kr, vr = k_flat.index_select(0, kv), v_flat.index_select(0, kv)
        o = F.scaled_dot_product_attention(
            q.reshape(1, kvh, -1, d), kr.transpose(0, 1)[None], vr.transpose(0, 1)[None]
        )
        return o.reshape(1, -1, d)

    @staticmethod
    def _decode(
        qd: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, p: _Plan
    ) -> torch.Tensor:
        """Decode rows (Bd, H, D) against their padded KV: (Bd, H, D). The heads sharing
        a KV head are its queries, so each K/V row is read once per group, not per head."""
        bd, kvh, d = qd.shape[0], k_flat.shape[1], k_flat.shape[2]
        kd = k_flat.index_select(0, p.decode_slots).view(bd, -1, kvh, d).transpose(1, 2)
        vd = v_flat.index_select(0, p.decode_slots).view(bd, -1, kvh, d).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            qd.view(bd, kvh, -1, d), kd, vd, attn_mask=p.decode_mask
        )
        return out.reshape(bd, -1, d)
