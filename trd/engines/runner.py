"""ModelRunner: owns the model, the KV tensors, the attention backend and the CUDA graphs.

One call runs one step: every scheduled request feeds `seq[kv_len : kv_len + n]`,
packed along one token axis. Rows whose feed reaches the end of the committed
sequence yield next-token logits (float32) over the tokenizer's vocabulary
(`vocab_limit` ids: the embedding matrix may have padding rows past it), the last hidden
state and the greedy token.
On CUDA a step whose shape fits a captured bucket replays that graph (`graphs.py`);
any other step, and every step on CPU, runs eagerly. Inputs travel to the device from
pinned memory without blocking; nothing here copies back to the host.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from trd.engines.buckets import graph_shapes
from trd.engines.graphs import StepGraphs, device_tensor
from trd.engines.scheduler import Scheduled
from trd.engines.spec import EngineSpec
from trd.models import qkernel
from trd.models.attention import BatchLayout, make_backend, resolve_backend
from trd.models.attention.base import AttentionBackend
from trd.models.attention.torch_paged import TorchPagedAttention
from trd.models.dispatch import measure, resident_bytes, set_crossover
from trd.models.loader import load_model, torch_dtype
from trd.models.native_stack import NativeStack
from trd.models.packed import onednn_available, pack_linears

log = logging.getLogger(__name__)


@dataclass(slots=True)
class ForwardOutput:
    items: list[Scheduled]  # the scheduled feeds that completed, in batch order
    logits: torch.Tensor  # (B, V) float32 (float64 for float64 models) next-token logits
    hidden: torch.Tensor  # (B, hidden) final-norm hidden state of their last token
    greedy: torch.Tensor  # (B,) argmax of the logits

    @staticmethod
    def concat(outs: list[ForwardOutput], empty: ForwardOutput) -> ForwardOutput:
        outs = [empty, *outs]
        return ForwardOutput(
            [item for o in outs for item in o.items],
            torch.cat([o.logits for o in outs]),
            torch.cat([o.hidden for o in outs]),
            torch.cat([o.greedy for o in outs]),
        )


class ModelTimer:
    """Seconds inside the model forward. On CUDA CUDA events bracket it, read (after one
    device synchronize) only when asked, so serving pays no synchronisation for it. At most
    MAX_PENDING steps' events are kept when nothing reads the timer (serving): past that,
    the steps the device has finished are folded into the total, and if it is that far
    behind, the host waits for the oldest one."""

    MAX_PENDING = 64

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._seconds = 0.0
        self._events: deque[tuple[torch.cuda.Event, torch.cuda.Event]] = deque()
        self._start: torch.cuda.Event | float = 0.0

    def start(self) -> None:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self) -> None:
        if isinstance(self._start, float):
            self._seconds += time.perf_counter() - self._start
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._events.append((self._start, end))
        if len(self._events) > self.MAX_PENDING:
            while self._events and self._events[0][1].query():
                self._fold()
            if len(self._events) > self.MAX_PENDING:
                self._events[0][1].synchronize()
                self._fold()

    def _fold(self) -> None:
        start, end = self._events.popleft()
        self._seconds += start.elapsed_time(end) / 1e3

    @property
    def seconds(self) -> float:
        if self._events:
            torch.cuda.synchronize()
            while self._events:
                self._fold()
        return self._seconds

    @seconds.setter
    def seconds(self, value: float) -> None:
        self._events.clear()
        self._seconds = value


class ModelRunner:
    def __init__(self, spec: EngineSpec) -> None:
        self.device = torch.device(spec.device)
        self.dtype = torch_dtype(spec.dtype)
        # Softmax, top-p and entropies in half precision distort sampling and routing.
        self.logits_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        self.cfg = spec.checkpoint.config
        self.vocab = spec.checkpoint.vocab_limit
        ckpt_mode = spec.checkpoint.quantization
        self.quantization = ckpt_mode if ckpt_mode != "none" else spec.quantization
        settings = spec.settings
        if settings.cpu_linear == "onednn" and not onednn_available():
            raise ValueError("engine.cpu_linear: 'onednn': this torch build has no oneDNN linear")
        self.model = load_model(spec.checkpoint, spec.dtype, self.device, spec.quantization)
        if settings.cpu_linear == "onednn":
            pack_linears(self.model)
        # Quantised linears: from how many rows the dense path is faster here (logged).
        self.crossover: dict[str, int | None] = {}
        if self.device.type == "cpu" and self.quantization != "none":
            fixed = settings.quant_dense_from
            if fixed is None:
                self.crossover = measure(self.model, settings.max_batch_tokens, self.dtype)
            else:
                self.crossover = set_crossover(self.model, fixed or None)
        self.weight_bytes = resident_bytes(self.model)
        self.page_size = settings.page_size
        self.attention = resolve_backend(settings.attention, self.device, self.cfg, spec.dtype)
        # The graphs this engine will capture share the eager backend's workspaces.
        shapes = graph_shapes(settings.graph_batches(), settings.graph_extend_lens)
        captures = self.device.type == "cuda" and settings.cuda_graphs
        self.backend = make_backend(self.attention, self.device, self.cfg, self.dtype,
                                    shapes=shapes if captures else ())  # fmt: skip
        native = self.crossover and self.dtype == torch.float32  # a quantised model's
        if isinstance(self.backend, TorchPagedAttention) and native:  # decode attention
            self.backend.native = qkernel.load()
        # One page past the allocator's (0 .. kv_pages-1): padded and warm-up rows write
        # their KV there, never into a request's pages.
        self.scratch_page = spec.kv_pages
        shape = (2, spec.kv_pages + 1, self.page_size, self.cfg.num_kv_heads, self.cfg.head_dim)
        self.kv_caches = [
            torch.zeros(shape, dtype=self.dtype, device=self.device)
            for _ in range(self.cfg.num_layers)
        ]
        # A quantised float32 model's decode steps: the decoder stack in one native call.
        self.stack = NativeStack.of(self.model, self.kv_caches) if native else None
        self.timer = ModelTimer(self.device)
        self.warm_up()
        self.graphs: StepGraphs | None = None
        if self.device.type == "cuda" and settings.cuda_graphs:
            if self.attention != "flashinfer":
                log.warning("CUDA graphs need the flashinfer attention backend: running eagerly")
            elif self.cfg.rope.rope_type == "dynamic":
                # Its frequencies depend on each step's sequence lengths, computed on the host.
                log.warning("CUDA graphs do not support dynamic rope: running eagerly")
            else:
                self.graphs = StepGraphs(self, settings, capture=True)

    @property
    def model_seconds(self) -> float:
        """Time inside the model forward (on CUDA: GPU time), for overhead accounting."""
        return self.timer.seconds

    @model_seconds.setter
    def model_seconds(self, value: float) -> None:
        self.timer.seconds = value

    @torch.inference_mode()
    def warm_up(self) -> None:
        """A decode and an extend on the scratch page, so that lazy set-up (flashinfer's
        JIT compilation, cuBLAS handles) happens at start and not in the first request."""
        for n in (1, 2):
            layout = BatchLayout([n], [0], [[self.scratch_page]], self.page_size)
            positions = np.arange(n)
            self.run(self.backend, layout, np.zeros(n, np.int64), positions, positions + 1,
                     np.array([n - 1]))  # fmt: skip

    def empty_output(self) -> ForwardOutput:
        """No rows: what a step whose every request failed yields."""
        logits = torch.empty(0, self.vocab, dtype=self.logits_dtype, device=self.device)
        hidden = torch.empty(0, self.cfg.hidden_size, dtype=self.dtype, device=self.device)
        return ForwardOutput(
            [], logits, hidden, torch.empty(0, dtype=torch.long, device=self.device)
        )

    def run(
        self,
        backend: AttentionBackend,
        layout: BatchLayout,
        ids: np.ndarray,
        positions: np.ndarray,
        seq_lens: np.ndarray,
        last: np.ndarray,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """An eager forward: logits, hidden state and greedy token of the tokens `last`.

        seq_lens (T,): the sequence length each token's feed catches up to (dynamic rope)."""
        backend.plan(layout)
        ids_t, positions_t = device_tensor(ids, self.device), device_tensor(positions, self.device)
        decode = backend.native_decode() if isinstance(backend, TorchPagedAttention) else None
        if self.stack is not None and decode is not None:
            hidden = self.stack(ids_t, positions_t, seq_lens, *decode)
        else:
            hidden = self.model(ids_t, positions_t, backend, self.kv_caches, seq_lens)
        rows = hidden[device_tensor(last, self.device)]
        # Rows past the tokenizer's vocabulary are padding: never sampled, never routed on.
        logits = self.model.logits(rows)[:, : self.vocab].to(self.logits_dtype)
        return logits, rows, torch.argmax(logits, dim=-1)

    @torch.inference_mode()
    def forward(self, batch: list[Scheduled]) -> ForwardOutput:
        ids: list[int] = []
        starts, lens, targets = [], [], []
        for item in batch:
            req, n = item.req, item.num_tokens
            ids.extend(req.seq[req.kv_len : req.kv_len + n])
            starts.append(req.kv_len)
            lens.append(n)
            targets.append(len(req.seq))
        layout = BatchLayout(lens, starts, [item.req.pages for item in batch], self.page_size,
                             [item.req.prompt_len for item in batch])  # fmt: skip
        done = [i for i, item in enumerate(batch) if item.completes]
        self.timer.start()
        out = self.graphs.run(layout, ids, done) if self.graphs is not None else None
        if out is None:
            positions = np.concatenate(
                [np.arange(s, s + n) for s, n in zip(starts, lens, strict=True)]
            )
            last = (np.cumsum(lens) - 1)[done]
            seq_lens = np.repeat(np.asarray(targets), lens)
            out = self.run(
                self.backend, layout, np.asarray(ids, np.int64), positions, seq_lens, last
            )
        self.timer.stop()
        return ForwardOutput([batch[i] for i in done], *out)
