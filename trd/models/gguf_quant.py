"""A GGUF tensor as a quantised weight (`trd/models/qformat.py`), at import.

    mode int4   Q4_K blocks -> 4 bits, read from the blocks themselves: a Q4_K sub-block
                of 32 is w = d * sc * q - dmin * m, our 4-bit group exactly (the scales
                rounded to float16: at most 2^-12 of a step); other types at or below
                4 bits (Q4_0, Q4_1, Q2_K, Q3_K) -> 4 bits by rounding their values, and
                every type with more bits -> 8 bits, except the decoder layers' linears
                from 5-bit blocks (Q5_0, Q5_1, Q5_K: most of Qwen2.5-0.5B's, whose 896
                columns are no multiple of 256), rounded to 4 bits: a 1-row step reads
                1.7x fewer bytes
    mode int8   every tensor -> 8 bits by rounding its values (Q8_0 exactly)

Rounding is `qformat.quantize` on the block's float32 values (gguf's dequantize).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf import ReaderTensor
from gguf.quants import dequantize

from trd.models.qformat import QuantTensor, pack_nibbles, quantize
from trd.models.quantization import EMBEDDING, HEAD

_AT_MOST_4 = (T.Q4_K, T.Q4_0, T.Q4_1, T.Q2_K, T.Q3_K)
_FIVE = (T.Q5_0, T.Q5_1, T.Q5_K)
_Q4_K_BYTES = 144  # per block of 256: d, dmin (float16), 12 bytes of scales, 128 of q


def target_bits(name: str, kind: T, mode: str) -> int:
    """Bits of HF weight `name` (without ".weight") from a GGUF block type."""
    if mode == "int8":
        return 8
    if kind in _AT_MOST_4 or (kind in _FIVE and name not in (EMBEDDING, HEAD)):
        return 4
    return 8


def gguf_quant(name: str, t: ReaderTensor, mode: str) -> QuantTensor:
    """GGUF tensor `t` (HF name `name`) in the bits `mode` gives it."""
    bits = target_bits(name, t.tensor_type, mode)
    if bits == 4 and t.tensor_type == T.Q4_K:
        return q4_k(np.asarray(t.data))
    return quantize(torch.from_numpy(dequantize(t.data, t.tensor_type)), bits)


def q4_k(data: np.ndarray) -> QuantTensor:
    """Rows of Q4_K blocks (rows, blocks * 144 bytes) as 4-bit groups of 32, unrounded q."""
    rows = data.shape[0]
    b = data.reshape(rows, -1, _Q4_K_BYTES)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # (rows, blocks)
    dmin = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    s = b[..., 4:16].astype(np.uint8)
    # 8 sub-blocks' 6-bit scale and min: llama.cpp's get_scale_min_k4.
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    qs = b[..., 16:].reshape(rows, -1, 4, 32)  # 4 chunks of 64 weights: low nibbles first
    q = np.stack([qs & 15, qs >> 4], axis=3).reshape(rows, -1)  # (rows, cols) in 0..15
    scales = (d[..., None] * sc).reshape(rows, -1).astype(np.float16)
    mins = (dmin[..., None] * mn).reshape(rows, -1).astype(np.float16)
    return QuantTensor(
        4, pack_nibbles(torch.from_numpy(q)), torch.from_numpy(scales), torch.from_numpy(mins)
    )
