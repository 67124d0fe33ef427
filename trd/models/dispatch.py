"""Which path a quantised linear takes for a step's row count, measured on this host.

The kernel (int8 activations x 4/8-bit weights) streams a quarter to half the bytes of
a bfloat16 matrix, so it wins at one row; at many rows both are compute-bound and the
answer depends on the CPU (AMX or AVX-512 bfloat16 would favour dense). At engine start,
for each (inputs, bits) of the model's quantised linears, a 256-output layer of that
shape is timed both ways at ROWS; the crossover is the first row count where dense was
faster, None when the kernel won at every one (the dense path then never runs). Dense
dequantises a slice of the weights per call, so neither choice keeps a second copy of
them (`trd/models/qlinear.py`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from torch import nn

from trd.models.qformat import quantize
from trd.models.qlinear import QuantLinear

log = logging.getLogger(__name__)

ROWS = (16, 128, 1024)
_OUT = 256  # outputs of the probe layer: both paths scale with it alike
_REPEATS = 2


def _best(fn: Callable[[], object]) -> float:
    fn()  # warm: first-touch allocations, the kernel's pages
    times = []
    for _ in range(_REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def crossover(in_features: int, bits: int, max_rows: int, dtype: torch.dtype) -> int | None:
    """The fewest rows (of ROWS, up to max_rows) at which dense beat the kernel."""
    gen = torch.Generator().manual_seed(0)
    layer = QuantLinear(quantize(torch.randn(_OUT, in_features, generator=gen), bits), None)
    if layer.kernel is None:
        return 1
    for rows in (r for r in ROWS if r <= max(max_rows, ROWS[0])):
        x = torch.randn(rows, in_features, generator=gen).to(dtype)
        kernel = _best(lambda: layer.kernel(x))  # type: ignore[misc]  # noqa: B023
        dense = _best(lambda: layer.dense(x))  # noqa: B023
        if dense < kernel:
            return rows
    return None


def crossovers(
    kinds: set[tuple[int, int]], max_rows: int, dtype: torch.dtype
) -> dict[tuple[int, int], int | None]:
    """`crossover` of each (inputs, bits)."""
    return {kind: crossover(*kind, max_rows, dtype) for kind in sorted(kinds)}


def describe(found: dict[tuple[int, int], int | None]) -> dict[str, int | None]:
    """{"<inputs>x<bits>bit": crossover}, for logs, stats and `--check`."""
    return {f"{k}x{b}bit": c for (k, b), c in found.items()}


def measure(model: nn.Module, max_rows: int, dtype: torch.dtype) -> dict[str, int | None]:
    """Set every QuantLinear's crossover; `describe`d, as logged."""
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    found = crossovers({(m.in_features, m.bits) for m in layers}, max_rows, dtype)
    for layer in layers:
        layer.crossover = found[(layer.in_features, layer.bits)]
    summary = describe(found)
    log.info("quantised linears, dense from this many rows (None: never, up to %d): %s",
             max_rows, summary)  # fmt: skip
    return summary


def set_crossover(model: nn.Module, rows: int | None) -> dict[str, int | None]:
    """Every QuantLinear's crossover set to `rows` (a configured one); `describe`d."""
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    for layer in layers:
        layer.crossover = rows
    return describe({(m.in_features, m.bits): rows for m in layers})


def resident_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each tensor once."""
    seen: set[int] = set()
    total = 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.data_ptr() not in seen and t.device.type != "meta":
            seen.add(t.data_ptr())
            total += t.nbytes
    return total
