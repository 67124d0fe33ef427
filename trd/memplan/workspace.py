"""flashinfer's float workspace for one engine, sized from the model and its graph buckets.

Every plan of an engine (the eager step's and each CUDA graph's) writes its split-KV
partial outputs into one shared float workspace; a plan that does not fit raises
"Buffer overflow" (flashinfer's AlignedAllocator), at graph capture or mid-serving. What
a plan needs, per flashinfer 0.6's FA2 scheduler (`PrefillPlan` in
include/flashinfer/attention/scheduler.cuh; the tensor-core decode plans with it too):

    g      = heads / kv_heads                 query rows packed per KV head
    split  = 2 x SMs / kv_heads               CTAs a split-KV plan may use
    cta    = 128 if packed rows > 64 and head_dim < 256, else 64 if > 16, else 16
    bytes  = heads x padded x cta x (head_dim + 1) x 4    (tmp_v and tmp_s, float32)

    eager step   splits only when the split batch fits: padded <= split, cta <= 128
    graph (b, t) always splits (CUDA-graph mode), padded to
                 max(split, ceil(tokens x g / cta) + rows - 1), cta from the longest row

The largest bucket decides: on an H200 (132 SMs) the extend graph (64, 8) of a 64/8-head
model (Qwen3-32B, Llama-3-70B) needs 391 MiB, Qwen3-8B's 163 MiB. The memory plan sizes
it for PLAN_SMS (more SMs than any GPU flashinfer 0.6 runs on has: H100/H200 132, B200
148, RTX PRO 6000 188), the engine for its own GPU, so the engine never takes more than
the plan reserved. Never below flashinfer's recommended 128 MiB.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

MIB = 1 << 20
PLAN_SMS = 192
MIN_FLOAT_WORKSPACE_BYTES = 128 * MIB
BLOCKS_PER_SM = 2  # flashinfer's FA2 plans: max_grid_size = 2 x SMs


class GraphSize(Protocol):
    """What the plan reads of a CUDA-graph bucket (the engines' `GraphShape`), so that the
    plan, below the engines, needs no import of theirs."""

    @property
    def batch(self) -> int: ...

    @property
    def rows(self) -> int: ...

    @property
    def tokens(self) -> int: ...


def cta_tile_q(packed_rows: int, head_dim: int) -> int:
    """flashinfer's FA2DetermineCtaTileQ on sm80 and newer."""
    if packed_rows > 64 and head_dim < 256:
        return 128
    return 64 if packed_rows > 16 else 16


def float_workspace_bytes(
    dims: tuple[int, int, int], shapes: Iterable[GraphSize] = (), sms: int = PLAN_SMS
) -> int:
    """The float workspace (bytes, whole MiB) for (heads, kv_heads, head_dim) serving eager
    steps and the CUDA graphs of `shapes` on a GPU of `sms` multiprocessors."""
    heads, kv_heads, head_dim = dims
    group = heads // kv_heads
    split = BLOCKS_PER_SM * sms // kv_heads

    def tmp(padded: int, cta: int) -> int:  # tmp_v, tmp_s, each aligned to 16 bytes
        return heads * padded * cta * (head_dim + 1) * 4 + 32

    need = tmp(split, cta_tile_q(65, head_dim))  # the eager bound: the widest tile
    for s in shapes:
        cta = cta_tile_q((s.tokens - s.rows + 1) * group, head_dim)
        tiles = -(-s.tokens * group // cta) + s.rows - 1
        need = max(need, tmp(max(split, tiles), cta))
    return max(-(-need // MIB) * MIB, MIN_FLOAT_WORKSPACE_BYTES)
