"""Attention over the paged KV layout with flashinfer kernels (the CUDA backend).

Pure-decode steps use `BatchDecodeWithPagedKVCacheWrapper` with tensor cores (it runs
the prefill kernels, which take any query/KV head ratio: without them decode supports
only ratios 1, 2, 3, 4, 6, 8); steps with any extend use the causal
`BatchPrefillWithPagedKVCacheWrapper`. Both pin flashinfer's FA2 backend: "auto" picks
FA3 on Hopper, which older releases do not support for every head size.

Planning wants host int32 arrays: flashinfer reads indptr and lengths on the host, so
device tensors would cost a blocking copy back each step; the page indices, which it
only copies, go to the device first. The arrays are staged in pinned memory so the
uploads are asynchronous (torch keeps a pinned block alive until its copy has run).
Plans of one wrapper are ordered by an event (`_ordered_plan`).

A backend built for a `GraphShape` is a CUDA-graph backend: its wrapper keeps the index
arrays in fixed device buffers sized for that shape, so a captured graph reads each
step's plan from the same addresses. Every backend of one engine shares one float and
one int workspace, the float one sized for the engine's graph `shapes` (the memory
plan's trd/memplan/workspace.py); plans never overlap because one step runs at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from trd.engines.buckets import GraphShape
from trd.memplan.plan import FLASHINFER_INT_WORKSPACE_BYTES
from trd.memplan.workspace import float_workspace_bytes
from trd.models.attention.base import AttentionBackend, BatchLayout, slot_indices

FLASHINFER_BACKEND = "fa2"
INSTALL_HINT = "install flashinfer (pip install 'tokenrouterd[gpu]', the flashinfer-python package)"


def import_flashinfer() -> Any:
    try:
        import flashinfer
    except ImportError as exc:
        raise ImportError(f"engine.attention: flashinfer: cannot import it ({exc}); "
                          f"{INSTALL_HINT}, or set engine.attention: torch") from None  # fmt: skip
    return flashinfer


def plan_arrays(layout: BatchLayout) -> dict[str, np.ndarray]:
    """flashinfer's paged-KV description of a step (int32) and the KV slot of each new token.

    kv_indptr[i]..kv_indptr[i+1] index row i's used pages in kv_indices; last_page_len
    is how many slots of its last page are used, so kv_len = start + new tokens.
    """
    ps = layout.page_size
    kv_lens = [s + n for s, n in zip(layout.kv_starts, layout.q_lens, strict=True)]
    used = [-(-total // ps) for total in kv_lens]
    tables = zip(layout.page_tables, used, strict=True)
    spans = zip(layout.page_tables, layout.kv_starts, layout.q_lens, strict=True)
    return {
        "qo_indptr": np.concatenate([[0], np.cumsum(layout.q_lens)]).astype(np.int32),
        "kv_indptr": np.concatenate([[0], np.cumsum(used)]).astype(np.int32),
        "kv_indices": np.concatenate([np.asarray(t[:u], dtype=np.int32) for t, u in tables]),
        "last_page_len": np.asarray(
            [total - (u - 1) * ps for total, u in zip(kv_lens, used, strict=True)], np.int32
        ),
        "write_slots": np.concatenate([slot_indices(t, s, s + n, ps) for t, s, n in spans]),
    }


def _pinned(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a).pin_memory()


def new_event() -> Any:
    """A CUDA event on the current stream, recorded by the caller."""
    return torch.cuda.Event()


class FlashInferPagedAttention(AttentionBackend):
    def __init__(
        self,
        device: torch.device,
        dims: tuple[int, int, int],
        dtype: torch.dtype,
        graph: GraphShape | None = None,
        max_pages: int = 0,
        share: FlashInferPagedAttention | None = None,
        shapes: Sequence[GraphShape] = (),
    ) -> None:
        fi = import_flashinfer()
        self.device, self.graph = device, graph
        self._dims, self._dtype = dims, dtype
        if share is None:  # zeroed, as flashinfer asks for the workspace's first use
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            ws = (float_workspace_bytes(dims, shapes, sms), FLASHINFER_INT_WORKSPACE_BYTES)
            self.float_ws, self.int_ws = (
                torch.zeros(n, dtype=torch.uint8, device=device) for n in ws
            )
        else:
            self.float_ws, self.int_ws = share.float_ws, share.int_ws
        fixed: dict[str, Any] = {}
        if graph is not None:  # the index arrays' fixed homes, sized for the shape
            fixed = {
                "use_cuda_graph": True,
                "paged_kv_indptr": torch.zeros(graph.rows + 1, dtype=torch.int32, device=device),
                "paged_kv_indices": torch.zeros(max_pages, dtype=torch.int32, device=device),
                "paged_kv_last_page_len": torch.zeros(graph.rows, dtype=torch.int32, device=device),
            }
            self._write_slots = torch.zeros(graph.tokens, dtype=torch.long, device=device)
        self._decode = self._prefill = None
        self._planned: dict[str, Any] = {}  # wrapper -> the event after its last plan
        if graph is None or graph.is_decode:
            self._decode = fi.BatchDecodeWithPagedKVCacheWrapper(
                self.float_ws, "NHD", use_tensor_cores=True, backend=FLASHINFER_BACKEND,
                **{k if k == "use_cuda_graph" else f"{k}_buffer": v for k, v in fixed.items()},
            )  # fmt: skip
        if graph is None or not graph.is_decode:
            if fixed:
                fixed["qo_indptr"] = torch.zeros_like(fixed["paged_kv_indptr"])
            self._prefill = fi.BatchPrefillWithPagedKVCacheWrapper(
                self.float_ws, "NHD", backend=FLASHINFER_BACKEND,
                **{k if k == "use_cuda_graph" else f"{k}_buf": v for k, v in fixed.items()},
            )  # fmt: skip
        for wrapper in (self._decode, self._prefill):
            if wrapper is not None:
                wrapper.reset_workspace_buffer(self.float_ws, self.int_ws)

    def plan(self, layout: BatchLayout) -> None:
        heads, kv_heads, head_dim = self._dims
        a = plan_arrays(layout)
        indptr, last = _pinned(a["kv_indptr"]), _pinned(a["last_page_len"])
        # On the device: flashinfer reads indptr and lengths on the host, but copies a host
        # `indices` with a blocking copy.
        indices = _pinned(a["kv_indices"]).to(self.device, non_blocking=True)
        if self.graph is None:
            self._write_slots = _pinned(a["write_slots"]).to(self.device, non_blocking=True)
        else:  # the graph's fixed buffer
            self._write_slots.copy_(_pinned(a["write_slots"]), non_blocking=True)
        kv = (indptr, indices, last)
        types = {"q_data_type": self._dtype, "kv_data_type": self._dtype}
        if self._decode is not None and all(n == 1 for n in layout.q_lens):
            self._ordered_plan("decode", *kv, heads, kv_heads, head_dim, layout.page_size,
                               **types)  # fmt: skip
            self._run = self._decode.run
        else:
            assert self._prefill is not None, f"an extend step planned on graph {self.graph}"
            qo = _pinned(a["qo_indptr"])
            self._ordered_plan("prefill", qo, *kv, heads, kv_heads, head_dim, layout.page_size,
                               causal=True, **types)  # fmt: skip
            self._run = self._prefill.run

    def _ordered_plan(self, which: str, *args: Any, **kwargs: Any) -> None:
        """The wrapper's plan(), once its previous plan's upload has run.

        plan() fills the wrapper's one pinned staging buffer on the host and queues its
        copy to the device without waiting (flashinfer's scheduler.cuh, PrefillPlan); a
        second plan before that copy has run would overwrite the indices the previous
        step's kernels read (a long prompt's chunks at an idle engine, the engine's
        per-request retry). An event after each plan orders them; the wait ends when the
        device reaches the previous plan of this wrapper, so the host still runs ahead."""
        wrapper = self._decode if which == "decode" else self._prefill
        assert wrapper is not None
        previous = self._planned.get(which)
        if previous is not None:
            previous.synchronize()
        wrapper.plan(*args, **kwargs)
        self._planned[which] = event = new_event()
        event.record()

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        kvh, d = k.shape[1], k.shape[2]
        kv_cache[0].view(-1, kvh, d).index_copy_(0, self._write_slots, k)
        kv_cache[1].view(-1, kvh, d).index_copy_(0, self._write_slots, v)
        out: torch.Tensor = self._run(q.contiguous(), (kv_cache[0], kv_cache[1]))
        return out
