"""Quantised weights: the format on disk (`QuantTensor`), round-to-nearest quantisers,
and the kernel's in-memory tiling.

A weight (N, K) is quantised in groups of 32 consecutive inputs of one output row:

    bits 4   w = s * q - m    q in 0..15     (llama.cpp's Q4_K sub-blocks exactly)
    bits 8   w = s * q        q in -127..127 (Q8_0 exactly; Q5_0 and Q6_K nearly)

with s and m in float16. On disk (a checkpoint's safetensors) a quantised `<name>.weight`
is three or two tensors, row-major:

    <name>.qweight   4 bits: uint8 (N, K/2), input 2i in the low nibble, 2i+1 in the high
                     8 bits: int8 (N, K)
    <name>.scales    float16 (N, K/32)
    <name>.mins      float16 (N, K/32), 4 bits only

In memory the kernel wants rows interleaved in tiles of 8 (`tile`; see qkernel.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 32
TILE = 8
SUFFIXES = ("qweight", "scales", "mins")


@dataclass(frozen=True, slots=True)
class QuantTensor:
    bits: int
    q: torch.Tensor
    scales: torch.Tensor
    mins: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.scales.shape[0], self.scales.shape[1] * GROUP

    def values(self) -> torch.Tensor:
        """q as integers (N, K): uint8 0..15 (4 bits) or int8 (8 bits)."""
        if self.bits == 8:
            return self.q
        n, k = self.shape
        return torch.stack((self.q & 0x0F, self.q >> 4), dim=-1).view(n, k)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        n, k = self.shape
        w = self.values().to(dtype).view(n, k // GROUP, GROUP) * self.scales.to(dtype)[..., None]
        if self.mins is not None:
            w = w - self.mins.to(dtype)[..., None]
        return w.view(n, k)

    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        """The checkpoint tensors of weight `name` ("...proj" without ".weight")."""
        out = {f"{name}.qweight": self.q, f"{name}.scales": self.scales}
        if self.mins is not None:
            out[f"{name}.mins"] = self.mins
        return out

    def rows(self, index: torch.Tensor) -> QuantTensor:
        """The output rows `index` (a permutation of heads, say)."""
        mins = None if self.mins is None else self.mins[index]
        return QuantTensor(self.bits, self.q[index], self.scales[index], mins)

    @classmethod
    def from_tensors(cls, name: str, tensors: dict[str, torch.Tensor]) -> QuantTensor:
        """Read back `tensors(name)`; ValueError naming the tensor if it is malformed."""
        q, scales = tensors[f"{name}.qweight"], tensors[f"{name}.scales"]
        mins = tensors.get(f"{name}.mins")
        bits = 4 if mins is not None else 8
        n, groups = scales.shape if scales.dim() == 2 else (-1, -1)
        qdtype = torch.uint8 if bits == 4 else torch.int8
        want = {
            "qweight": ((n, groups * GROUP * bits // 8), qdtype),
            "scales": ((n, groups), torch.float16),
            "mins": ((n, groups), torch.float16),
        }
        for suffix, t in (("qweight", q), ("scales", scales), ("mins", mins)):
            shape, dtype = want[suffix]
            if t is not None and (tuple(t.shape) != shape or t.dtype != dtype):
                raise ValueError(
                    f"{name}.{suffix}: {t.dtype} {tuple(t.shape)}, expected {dtype} {shape} "
                    f"({bits}-bit weight in groups of {GROUP})"
                )
        return cls(bits, q, scales, mins)


def quantize(w: torch.Tensor, bits: int) -> QuantTensor:
    """Round to nearest: 4 bits asymmetric (group min/max), 8 bits symmetric (group max|w|)."""
    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"cannot quantise a ({n}, {k}) weight: {k} inputs are not groups of 32")
    g = w.detach().to(torch.float32).view(n, k // GROUP, GROUP)
    if bits == 8:
        s = (g.abs().amax(-1) / 127).to(torch.float16)
        q = torch.round(g / _safe(s)[..., None]).clamp_(-127, 127).to(torch.int8)
        return QuantTensor(8, q.view(n, k), s)
    if bits != 4:
        raise ValueError(f"bits {bits}: expected 4 or 8")
    lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)  # 0 stays exact
    s = ((hi - lo) / 15).to(torch.float16)
    m = (-lo).to(torch.float16)
    q = torch.round((g + m.float()[..., None]) / _safe(s)[..., None]).clamp_(0, 15)
    return QuantTensor(4, pack_nibbles(q.to(torch.uint8).view(n, k)), s, m)


def _safe(s: torch.Tensor) -> torch.Tensor:
    """float16 scales as float32 divisors: an all-zero group divides by 1 (its q are 0)."""
    s = s.to(torch.float32)
    return torch.where(s > 0, s, torch.ones_like(s))


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """(N, K) uint8 in 0..15 -> (N, K/2): input 2i low nibble, 2i+1 high."""
    return q[:, 0::2] | (q[:, 1::2] << 4)


def concat(parts: list[QuantTensor]) -> QuantTensor:
    """Output rows of weights of one bit width stacked (q, k, v into one projection)."""
    mins = [p.mins for p in parts]
    return QuantTensor(
        parts[0].bits,
        torch.cat([p.q for p in parts]),
        torch.cat([p.scales for p in parts]),
        None if mins[0] is None else torch.cat([m for m in mins if m is not None]),
    )


def tile(qt: QuantTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The kernel's layout: qweight (N/8, K*bits) uint8, scales and mins (N/8, K/32, 8)."""
    n, k = qt.shape
    t = n // TILE
    v = qt.values()
    if qt.bits == 4:  # byte (b, j, i) = q[j][8b + i] | q[j][8b + 4 + i] << 4
        v = v.view(t, TILE, k // 8, 2, 4).permute(0, 2, 1, 4, 3)
        packed = v[..., 0] | (v[..., 1] << 4)
    else:  # byte (b, j, i) = q[j][4b + i]
        packed = v.view(torch.uint8).view(t, TILE, k // 4, 4).permute(0, 2, 1, 3)
    return (
        packed.contiguous().view(t, -1),
        _tile_groups(qt.scales),
        None if qt.mins is None else _tile_groups(qt.mins),
    )


def _tile_groups(g: torch.Tensor) -> torch.Tensor:
    n, groups = g.shape
    return g.view(n // TILE, TILE, groups).permute(0, 2, 1).contiguous()


def untile(
    bits: int, qweight: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor | None,
    rows: torch.Tensor | None = None,
) -> QuantTensor:  # fmt: skip
    """The rows `rows` (all if None) of a tiled weight, back in the disk format."""
    t, groups, _ = scales.shape
    k = groups * GROUP
    idx = torch.arange(t * TILE) if rows is None else rows
    tiles, j = idx // TILE, idx % TILE
    sc = scales[tiles, :, j]
    mn = None if mins is None else mins[tiles, :, j]
    if bits == 4:
        b = qweight.view(t, k // 8, TILE, 4)[tiles, :, j, :]  # (n, K/8, 4)
        v = torch.stack((b & 0x0F, b >> 4), dim=-2).view(len(idx), k)
        return QuantTensor(4, pack_nibbles(v), sc, mn)
    b = qweight.view(t, k // 4, TILE, 4)[tiles, :, j, :]
    return QuantTensor(8, b.reshape(len(idx), k).view(torch.int8), sc)
