"""ModelRunner: owns the model, the KV tensors and the attention backend.

One call runs one step: every scheduled request feeds `seq[kv_len : kv_len + n]`,
packed along one token axis. Rows whose feed reaches the end of the committed
sequence yield next-token logits over the tokenizer's vocabulary (`vocab_limit` ids:
the embedding matrix may have padding rows past it) and the last hidden state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from trd.engines.attention import BatchLayout, make_backend
from trd.engines.loader import load_model, torch_dtype
from trd.engines.packed import onednn_available, pack_linears
from trd.engines.scheduler import Scheduled
from trd.engines.spec import EngineSpec


@dataclass(slots=True)
class ForwardOutput:
    items: list[Scheduled]  # the scheduled feeds that completed, in batch order
    logits: torch.Tensor  # (B, V) next-token logits for those items
    hidden: torch.Tensor  # (B, hidden) final-norm hidden state of their last token

    def select(self, rows: list[int]) -> ForwardOutput:
        index = torch.tensor(rows, dtype=torch.long, device=self.logits.device)
        return ForwardOutput([self.items[i] for i in rows], self.logits[index], self.hidden[index])

    @staticmethod
    def concat(outs: list[ForwardOutput], empty: ForwardOutput) -> ForwardOutput:
        outs = [empty, *outs]
        return ForwardOutput(
            [item for o in outs for item in o.items],
            torch.cat([o.logits for o in outs]),
            torch.cat([o.hidden for o in outs]),
        )


class ModelRunner:
    def __init__(self, spec: EngineSpec) -> None:
        self.device = torch.device(spec.device)
        self.dtype = torch_dtype(spec.dtype)
        # Softmax, top-p and entropies in half precision distort sampling and routing.
        self.logits_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        self.cfg = spec.checkpoint.config
        self.vocab = spec.checkpoint.vocab_limit
        settings = spec.settings
        if settings.cpu_linear == "onednn" and not onednn_available():
            raise ValueError("engine.cpu_linear: 'onednn': this torch build has no oneDNN linear")
        self.model = load_model(spec.checkpoint, spec.dtype, self.device)
        if settings.cpu_linear == "onednn":
            pack_linears(self.model)
        self.page_size = settings.page_size
        self.backend = make_backend(settings.attention, self.device, self.cfg, self.dtype)
        shape = (2, spec.kv_pages, self.page_size, self.cfg.num_kv_heads, self.cfg.head_dim)
        self.model_seconds = 0.0  # time inside the model forward, for overhead accounting
        self.kv_caches = [
            torch.zeros(shape, dtype=self.dtype, device=self.device)
            for _ in range(self.cfg.num_layers)
        ]

    def empty_output(self) -> ForwardOutput:
        """No rows: what a step whose every request failed yields."""
        logits = torch.empty(0, self.vocab, dtype=self.logits_dtype, device=self.device)
        hidden = torch.empty(0, self.cfg.hidden_size, dtype=self.dtype, device=self.device)
        return ForwardOutput([], logits, hidden)

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
        positions = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
        self.backend.plan(
            BatchLayout(lens, starts, [item.req.pages for item in batch], self.page_size)
        )
        start = time.perf_counter()
        hidden = self.model(
            torch.tensor(ids, dtype=torch.long, device=self.device),
            torch.from_numpy(positions).to(self.device),
            self.backend,
            self.kv_caches,
            np.repeat(np.asarray(targets), lens),
        )
        ends = np.cumsum(lens) - 1
        done = [i for i, item in enumerate(batch) if item.completes]
        last = hidden[torch.from_numpy(ends[done]).to(self.device)]
        # Rows past the tokenizer's vocabulary are padding: never sampled, never routed on.
        logits = self.model.logits(last)[:, : self.vocab].to(self.logits_dtype)
        self.model_seconds += time.perf_counter() - start
        return ForwardOutput([batch[i] for i in done], logits, last)
