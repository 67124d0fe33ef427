"""oneDNN-packed linear layers for float32 on CPU (engine option `cpu_linear: onednn`).

torch's CPU `F.linear` goes to the BLAS library it was built with, where (MKL, the
2-core host of this project's benchmarks) 2 rows already cost twice one; oneDNN with
weights reordered once into its blocked layout runs the skinny matrices of a decode
batch 2-2.5x faster from 2 rows up (Qwen2.5-Coder's shapes). Each call costs 25-50 us,
so it does not pay for tiny layers. Results differ from `F.linear` in the last bits
(another summation order), so greedy outputs can part from transformers' at a near
tie; that is why it is an option and not the default.
"""

from __future__ import annotations

import torch
from torch import nn

# The row count oneDNN tunes the packed layout for; any count works.
_ROWS_HINT = 16
# Fewer rows than this take oneDNN's slower path (measured on the benchmark host, one
# thread, Qwen2.5's 1.5B shapes: 1 row 3.2 ms, 2 rows 3.2, 4 rows 2.5 for 1536 -> 8960;
# the 151,936-token head 60 / 70 / 42 ms), so fewer rows are padded with zeros to it.
_MIN_ROWS = 4


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(
        torch.ops.mkldnn, "_reorder_linear_weight"
    )


class PackedLinear(nn.Module):
    """`nn.Linear` with its weight reordered for oneDNN; inference only."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, _ROWS_HINT)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        n = rows.shape[0]
        if n < _MIN_ROWS:
            rows = torch.nn.functional.pad(rows, (0, 0, 0, _MIN_ROWS - n))
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out[:n].reshape(*x.shape[:-1], out.shape[-1])


def pack_linears(model: nn.Module) -> None:
    """Replace every `nn.Linear` in model by a `PackedLinear`."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, PackedLinear(child))
