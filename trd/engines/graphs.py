"""CUDA graphs for decode and extend steps: one per bucket, padded and replayed.

    StepGraphs.run(layout, ids, done)
        pick_shape      -> None: the step runs eagerly (too many rows or tokens)
        pad_step        -> dummy rows on the scratch page (padding.py)
        graph.load      -> the attention plan into the graph's fixed index buffers, token
                           ids / positions / last-token rows into its static inputs
        graph.replay    -> model, logits (float32), greedy argmax: one launch
        the real rows' outputs, copied out of the shared output buffers

Every graph writes into one set of output buffers (logits, hidden, greedy) and all share
one memory pool, captured largest first so the smaller ones reuse its memory. That is
safe because one graph runs at a time and its outputs are copied before the next one.
Sampling of non-greedy rows and the policy's tensor work run after the replay, on the
same stream: they depend on per-request parameters that change every step.

With `capture=False` (CPU, tests) the same buffers and padding run eagerly, so the
padding is tested without a GPU.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trd.engines.buckets import GraphShape, graph_shapes, pick_shape
from trd.engines.padding import PaddedStep, pad_step
from trd.engines.spec import EngineSettings
from trd.models.attention import BatchLayout, make_backend

if TYPE_CHECKING:  # the runner builds the graphs
    from torch.cuda import _POOL_HANDLE

    from trd.engines.runner import ModelRunner

log = logging.getLogger(__name__)
Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # logits, hidden, greedy


def device_tensor(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """`a` on `device`; to a GPU from pinned memory, without blocking the host."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


class StepGraphs:
    def __init__(self, runner: ModelRunner, settings: EngineSettings, capture: bool) -> None:
        self.runner = runner
        self.shapes = graph_shapes(settings.graph_batches(), settings.graph_extend_lens)
        cfg, dev, rows = runner.cfg, runner.device, max(s.batch for s in self.shapes)
        self.logits = torch.zeros(rows, runner.vocab, dtype=runner.logits_dtype, device=dev)
        self.hidden = torch.zeros(rows, cfg.hidden_size, dtype=runner.dtype, device=dev)
        self.greedy = torch.zeros(rows, dtype=torch.long, device=dev)
        # Every page of the pool at most once, plus the pages the dummy rows list.
        extra = max(s.rows + -(-s.tokens // runner.page_size) for s in self.shapes)
        max_pages = runner.scratch_page + extra
        self.used: Counter[GraphShape] = Counter()  # replays per bucket
        self.eager_steps = 0
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle() if capture else None
        self.graphs = {s: _Graph(self, s, max_pages, pool) for s in self.shapes}
        # The graphs' private pool as torch's allocator holds it (memory_reserved() across
        # the captures reads low: each capture empties the cache first).
        self.capture_bytes = 0 if pool is None else pool_bytes(torch.cuda.memory_snapshot(), pool)
        if capture:
            log.info("captured %d CUDA graphs in %.1f s (pool %.0f MiB)", len(self.graphs),
                     time.perf_counter() - start, self.capture_bytes / 2**20)  # fmt: skip

    def run(self, layout: BatchLayout, ids: list[int], done: list[int]) -> Outputs | None:
        """The step's outputs for rows `done`, or None when no graph holds the step."""
        shape = pick_shape(layout.q_lens, self.shapes)
        if shape is None:
            self.eager_steps += 1
            return None
        graph = self.graphs[shape]
        graph.load(pad_step(layout, ids, shape, self.runner.scratch_page))
        graph.replay()
        self.used[shape] += 1
        if done == list(range(len(layout.q_lens))):
            rows = slice(0, len(done))
            return self.logits[rows].clone(), self.hidden[rows].clone(), self.greedy[rows].clone()
        index = device_tensor(np.asarray(done, np.int64), self.runner.device)
        return self.logits[index], self.hidden[index], self.greedy[index]


def pool_bytes(segments: list[dict[str, Any]], pool: tuple[int, int]) -> int:
    """Bytes of the allocator segments (torch.cuda.memory_snapshot()) that belong to `pool`."""
    return sum(s["total_size"] for s in segments if tuple(s.get("segment_pool_id", ())) == pool)


class _Graph:
    """One bucket: static inputs, a CUDA-graph attention backend, the captured graph."""

    def __init__(
        self, owner: StepGraphs, shape: GraphShape, max_pages: int, pool: _POOL_HANDLE | None
    ) -> None:
        r = owner.runner
        self.owner, self.shape = owner, shape
        self.backend = make_backend(r.attention, r.device, r.cfg, r.dtype, shape, max_pages,
                                    share=r.backend)  # fmt: skip
        self.ids = torch.zeros(shape.tokens, dtype=torch.long, device=r.device)
        self.positions = torch.zeros(shape.tokens, dtype=torch.long, device=r.device)
        self.last = torch.zeros(shape.batch, dtype=torch.long, device=r.device)
        self.no_lens = np.zeros(shape.tokens, dtype=np.int64)
        self.graph: torch.cuda.CUDAGraph | None = None
        if pool is not None:
            self._capture(pool)

    @torch.inference_mode()
    def _capture(self, pool: _POOL_HANDLE) -> None:
        empty = BatchLayout([], [], [], self.owner.runner.page_size)
        self.load(pad_step(empty, [], self.shape, self.owner.runner.scratch_page))
        self._body()  # lazy set-up (kernel loading, cuBLAS workspaces) outside the capture
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self._body()

    def load(self, step: PaddedStep) -> None:
        dev = self.owner.runner.device
        self.backend.plan(step.layout)
        self.ids.copy_(device_tensor(step.ids, dev), non_blocking=True)
        self.positions.copy_(device_tensor(step.positions, dev), non_blocking=True)
        self.last.copy_(device_tensor(step.last, dev), non_blocking=True)

    def replay(self) -> None:
        if self.graph is None:
            self._body()
        else:
            self.graph.replay()

    def _body(self) -> None:
        r, out, b = self.owner.runner, self.owner, self.shape.batch
        # Graphs run only for rope variants that ignore the sequence lengths (not dynamic).
        hidden = r.model(self.ids, self.positions, self.backend, r.kv_caches, self.no_lens)
        last = hidden[self.last]
        out.hidden[:b].copy_(last)
        out.logits[:b].copy_(r.model.logits(last)[:, : r.vocab])
        torch.argmax(out.logits[:b], dim=-1, out=out.greedy[:b])
