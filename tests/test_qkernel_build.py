"""The kernel library as built for this host: with VNNI and the 512-bit two-tile pass where
the CPU has them, and then the same bits as the plain AVX2 build (one vpdpbusd makes the
integer sums vpmaddubsw and vpmaddwd make), so a model's tokens do not depend on which host
served them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trd.models import qkernel
from trd.models.qformat import quantize
from trd.models.qlinear import QuantLinear


def test_vnni_flags_follow_the_cpu(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    wide = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")
    for flags, want in [
        ("fpu avx2 fma f16c", ()),
        ("fpu avx2 avx512f avx512bw avx512vl avx512_vnni", wide),
        ("fpu avx2 avx_vnni avx512f avx512bw avx512vl avx512_vnni", ("-mavxvnni", *wide)),
        ("fpu avx2 avx_vnni avx512f", ("-mavxvnni",)),
        ("fpu avx2 avx512f avx512vl avx512_vnni", ()),  # no AVX-512 BW: no 512-bit pass
    ]:
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        assert qkernel.host_flags(cpuinfo) == want
    assert qkernel.host_flags(tmp_path / "absent") == ()


@pytest.mark.skipif(qkernel.why_not() is not None, reason=str(qkernel.why_not()))
@pytest.mark.skipif(not qkernel.host_flags(), reason="this CPU adds nothing: one build only")
def test_this_hosts_build_gives_the_plain_builds_bits(tmp_path: Path) -> None:
    """The linear (odd and even tile counts for the two-tile pass, every row remainder,
    more rows than one block) and the float32 glue, bit for bit, host build and AVX2 build."""
    host = qkernel.load()
    assert host is not None
    plain_path = tmp_path / "plain.so"
    cxx = qkernel._compiler()
    assert cxx is not None
    qkernel.compile_library(cxx, qkernel.FLAGS, plain_path)
    plain = qkernel.Kernel(plain_path)
    gen = torch.Generator().manual_seed(0)
    for bits in (4, 8):
        for n in (8, 24, 264):  # 1, 3 and 33 tiles
            w, b = torch.randn(n, 256, generator=gen), torch.randn(n, generator=gen)
            layer = QuantLinear(quantize(w, bits), b)
            args = (layer.qweight, layer.scales, layer.mins, layer.bias, bits)
            for rows in (1, 2, 3, 5, 9, 33):
                x = torch.randn(rows, 256, generator=gen) * 5
                assert torch.equal(host.bind(*args)(x), plain.bind(*args)(x)), (bits, n, rows)
    x, weight = torch.randn(5, 96, generator=gen) * 4, torch.randn(96, generator=gen)
    assert torch.equal(host.rmsnorm(x, weight, 1e-6), plain.rmsnorm(x, weight, 1e-6))
    gate, up = torch.randn(3, 100, generator=gen) * 9, torch.randn(3, 100, generator=gen)
    assert torch.equal(host.silu_mul(gate, up), plain.silu_mul(gate, up))
    qk, cos, sin = (torch.randn(4, 6, 32, generator=gen) for _ in range(3))
    rotated = [qk.clone(), qk.clone()]
    host.rope_(rotated[0], cos[:, 0], sin[:, 0])
    plain.rope_(rotated[1], cos[:, 0], sin[:, 0])
    assert torch.equal(*rotated)
    q, k, v = torch.randn(3, 6, 32, generator=gen), *torch.randn(2, 40, 2, 32, generator=gen)
    queries, offsets = torch.arange(3), torch.tensor([0, 7, 17, 40])
    slots = torch.randperm(40, generator=gen)
    outs = [torch.empty(3, 6, 32), torch.empty(3, 6, 32)]
    host.decode_attention(q, k, v, outs[0], queries, offsets, slots)
    plain.decode_attention(q, k, v, outs[1], queries, offsets, slots)
    assert torch.equal(*outs)
