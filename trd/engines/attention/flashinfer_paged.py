"""Attention over the paged KV layout with flashinfer kernels (the CUDA backend).

Pure-decode steps use `BatchDecodeWithPagedKVCacheWrapper`; steps with any extend use
`BatchPrefillWithPagedKVCacheWrapper` (causal; queries sit at the end of each KV
sequence). Both are planned once per step and run once per layer. New K/V are
scattered into the pages with the same flat-slot indexing as the torch backend.
"""

from __future__ import annotations

import flashinfer
import numpy as np
import torch

from trd.engines.attention.base import AttentionBackend, BatchLayout, slot_indices
from trd.memplan.plan import FLASHINFER_WORKSPACE_BYTES


class FlashInferPagedAttention(AttentionBackend):
    def __init__(
        self, device: torch.device, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> None:
        self.device = device
        self._dims = (heads, kv_heads, head_dim, dtype)
        workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
        self._wrapper: (
            flashinfer.BatchDecodeWithPagedKVCacheWrapper
            | flashinfer.BatchPrefillWithPagedKVCacheWrapper
            | None
        ) = None
        self._write_slots = torch.empty(0, dtype=torch.long, device=device)

    def plan(self, layout: BatchLayout) -> None:
        heads, kv_heads, head_dim, dtype = self._dims
        ps = layout.page_size
        kv_lens = [s + n for s, n in zip(layout.kv_starts, layout.q_lens, strict=True)]
        used = [-(-total // ps) for total in kv_lens]
        indices = np.concatenate(
            [
                np.asarray(t[:u], dtype=np.int32)
                for t, u in zip(layout.page_tables, used, strict=True)
            ]
        )
        indptr = np.concatenate([[0], np.cumsum(used)]).astype(np.int32)
        last = np.asarray([total - (u - 1) * ps for total, u in zip(kv_lens, used, strict=True)])
        slots = [
            slot_indices(t, s, s + n, ps)
            for t, s, n in zip(layout.page_tables, layout.kv_starts, layout.q_lens, strict=True)
        ]
        self._write_slots = torch.from_numpy(np.concatenate(slots)).to(self.device)
        kv_args = (
            torch.from_numpy(indptr).to(self.device),
            torch.from_numpy(indices).to(self.device),
            torch.from_numpy(last.astype(np.int32)).to(self.device),
        )
        if all(n == 1 for n in layout.q_lens):
            self._decode.plan(
                *kv_args, heads, kv_heads, head_dim, ps, q_data_type=dtype, kv_data_type=dtype
            )
            self._wrapper = self._decode
        else:
            qo = np.concatenate([[0], np.cumsum(layout.q_lens)]).astype(np.int32)
            self._prefill.plan(
                torch.from_numpy(qo).to(self.device),
                *kv_args,
                heads,
                kv_heads,
                head_dim,
                ps,
                causal=True,
                q_data_type=dtype,
                kv_data_type=dtype,
            )
            self._wrapper = self._prefill

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        assert self._wrapper is not None, "plan() must run before attend()"
        kvh, d = k.shape[1], k.shape[2]
        kv_cache[0].view(-1, kvh, d).index_copy_(0, self._write_slots, k)
        kv_cache[1].view(-1, kvh, d).index_copy_(0, self._write_slots, v)
        return self._wrapper.run(q.contiguous(), (kv_cache[0], kv_cache[1]))
