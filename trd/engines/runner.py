"""ModelRunner: owns the model, the KV tensors and the attention backend.

One call runs one step: every scheduled request feeds `seq[kv_len : kv_len + n]`,
packed along one token axis. Rows whose feed reaches the end of the committed
sequence yield next-token logits and the last hidden state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trd.engines.attention import BatchLayout, make_backend
from trd.engines.checkpoint import ModelConfig, load_config
from trd.engines.loader import load_model, torch_dtype
from trd.engines.packed import onednn_available, pack_linears
from trd.engines.scheduler import Scheduled
from trd.engines.spec import CPU_LINEARS


@dataclass(slots=True)
class ForwardOutput:
    items: list[Scheduled]  # the scheduled feeds that completed, in batch order
    logits: torch.Tensor  # (B, V) next-token logits for those items
    hidden: torch.Tensor  # (B, hidden) final-norm hidden state of their last token


def check_cpu_linear(choice: str, device: torch.device, dtype: str) -> None:
    if choice not in CPU_LINEARS:
        raise ValueError(f"cpu_linear {choice!r} is not one of {CPU_LINEARS}")
    if choice == "onednn" and (device.type != "cpu" or dtype != "float32"):
        raise ValueError(
            f"cpu_linear 'onednn' needs device cpu and dtype float32, got {device}, {dtype}"
        )
    if choice == "onednn" and not onednn_available():
        raise ValueError("cpu_linear 'onednn': this torch build has no oneDNN linear")


class ModelRunner:
    def __init__(
        self,
        model_dir: Path,
        *,
        dtype: str,
        device: str,
        num_pages: int,
        page_size: int,
        attention: str = "auto",
        cpu_linear: str = "torch",
    ) -> None:
        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        self.dtype = torch_dtype(dtype)
        check_cpu_linear(cpu_linear, self.device, dtype)
        self.cfg: ModelConfig = load_config(self.model_dir)
        self.model = load_model(self.model_dir, self.cfg, dtype, self.device)
        if cpu_linear == "onednn":
            pack_linears(self.model)
        self.page_size = page_size
        self.backend = make_backend(attention, self.device, self.cfg, self.dtype)
        shape = (2, num_pages, page_size, self.cfg.num_kv_heads, self.cfg.head_dim)
        self.model_seconds = 0.0  # time inside the model forward, for overhead accounting
        self.kv_caches = [
            torch.zeros(shape, dtype=self.dtype, device=self.device)
            for _ in range(self.cfg.num_layers)
        ]

    @torch.inference_mode()
    def forward(self, batch: list[Scheduled]) -> ForwardOutput:
        ids: list[int] = []
        starts, lens = [], []
        for item in batch:
            req, n = item.req, item.num_tokens
            ids.extend(req.seq[req.kv_len : req.kv_len + n])
            starts.append(req.kv_len)
            lens.append(n)
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
        )
        ends = np.cumsum(lens) - 1
        done = [i for i, item in enumerate(batch) if item.completes]
        last = hidden[torch.from_numpy(ends[done]).to(self.device)]
        logits = self.model.logits(last)
        self.model_seconds += time.perf_counter() - start
        return ForwardOutput([batch[i] for i in done], logits, last)
