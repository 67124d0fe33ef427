"""Linear and embedding layers over quantised weights (`trd/models/qformat.py`).

`QuantLinear` picks a path per call:

    float64 input          the reference: activations quantised per row and group of 32
                           exactly as the kernel does, in float64 (the oracle and the
                           engines' float64 test runs compute the same numbers)
    CPU, rows < crossover  the kernel (`qkernel.py`): int8 activations x 4/8-bit weights
    otherwise              dense: the weights dequantised to float32 a slice at a time,
                           torch's linear (CUDA: `_weight_int4pack_mm` for 4 bits, see
                           `CudaInt4`)

`crossover` is measured per host at engine start (`trd/models/dispatch.py`); None keeps
the kernel for every row count. A row's result never depends on the other rows of its
batch on the kernel's path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trd.models import qkernel
from trd.models.qformat import GROUP, TILE, QuantTensor, concat, tile, untile

_DENSE_ROWS = 4096  # output rows dequantised at a time on the dense path
_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def fake_quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """x (M, K) as the kernel sees it: per row and group of 32, d = max|x| / 127 and
    x ~ d * round(x / d) (round half to even, as the kernel's cvtps)."""
    m, k = x.shape
    g = x.view(m, k // GROUP, GROUP)
    d = g.abs().amax(-1, keepdim=True) / 127
    q = torch.round(g / torch.where(d > 0, d, torch.ones_like(d)))
    return (q * d).view(m, k)


class QuantLinear(nn.Module):
    """y = x W^T + b with W quantised; inference only. The kernel holds the buffers'
    addresses: the layer stays on the CPU it was built on."""

    qweight: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None
    bias: torch.Tensor | None

    def __init__(self, qt: QuantTensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = qt.shape
        if self.out_features % TILE or self.in_features % GROUP:
            raise ValueError(f"a quantised linear needs out % {TILE} == 0 and in % {GROUP} "
                             f"== 0, got ({self.out_features}, {self.in_features})")  # fmt: skip
        self.bits = qt.bits
        qweight, scales, mins = tile(qt)
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("mins", mins)
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        self.crossover: int | None = None
        self._float64: torch.Tensor | None = None
        kernel = qkernel.load()
        self.kernel = None if kernel is None else kernel.bind(qweight, scales, mins, self.bias,
                                                               self.bits)  # fmt: skip

    def quant(self, rows: torch.Tensor | None = None) -> QuantTensor:
        return untile(self.bits, self.qweight, self.scales, self.mins, rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (  # the model's own calls: 2-D rows on the host, in few enough rows
            self.kernel is not None
            and x.dim() == 2
            and x.dtype in _KERNEL_DTYPES
            and (self.crossover is None or x.shape[0] < self.crossover)
            and x.is_contiguous()
        ):
            return self.kernel(x)
        rows = x.reshape(-1, self.in_features)
        if x.dtype == torch.float64:
            if self._float64 is None:  # tests' float64 runs only: kept once made
                self._float64 = self.quant().dequantize(torch.float64)
            y = F.linear(fake_quantize_rows(rows), self._float64)
            y = y if self.bias is None else y + self.bias.double()
        elif (
            self.kernel is not None
            and x.dtype in _KERNEL_DTYPES
            and (self.crossover is None or len(rows) < self.crossover)
        ):
            y = self.kernel(rows.contiguous())
        else:
            y = self.dense(rows)
        return y.view(*x.shape[:-1], self.out_features)

    def dense(self, rows: torch.Tensor) -> torch.Tensor:
        """Without activation quantisation: the weights dequantised a slice at a time."""
        x = rows.float()
        outs = []
        for start in range(0, self.out_features, _DENSE_ROWS):
            idx = torch.arange(start, min(start + _DENSE_ROWS, self.out_features))
            w = self.quant(idx.to(self.qweight.device)).dequantize(torch.float32)
            b = None if self.bias is None else self.bias[start : start + len(idx)]
            outs.append(F.linear(x, w, b))
        return torch.cat(outs, dim=-1).to(rows.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bits={self.bits}"


class QuantEmbedding(nn.Module):
    """Token embeddings gathered from a quantised (V, hidden) matrix, dequantised per row.
    With tied embeddings the output projection shares its buffers (`head`)."""

    def __init__(self, qt: QuantTensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.table = QuantLinear(qt, None)
        self.dtype = dtype
        self.num_embeddings, self.embedding_dim = qt.shape  # as nn.Embedding's, for policies

    @property
    def device(self) -> torch.device:
        return self.table.qweight.device

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table.quant(ids.reshape(-1)).dequantize(self.dtype).view(*ids.shape, -1)

    @property
    def head(self) -> QuantLinear:
        return self.table


def fuse(parts: list[QuantLinear]) -> QuantLinear | None:
    """One layer computing `parts` side by side (q, k and v), or None when their bit
    widths differ or only some have a bias. Each output's arithmetic is its own layer's."""
    biases = [p.bias for p in parts]
    if len({p.bits for p in parts}) > 1 or len({b is None for b in biases}) > 1:
        return None
    bias = None if biases[0] is None else torch.cat([b for b in biases if b is not None])
    return QuantLinear(concat([p.quant() for p in parts]), bias)
