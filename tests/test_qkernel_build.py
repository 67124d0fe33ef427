"""The kernel library as built for this host: with VNNI where the CPU has it, and then the
same bits as the plain AVX2 build (one vpdpbusd makes the integer sums vpmaddubsw and
vpmaddwd make), so a model's tokens do not depend on which host served them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from trd.models import qkernel
from trd.models.qformat import quantize
from trd.models.qlinear import QuantLinear


def test_vnni_flags_follow_the_cpu(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    for flags, want in [
        ("fpu avx2 fma f16c", ()),
        ("fpu avx2 avx512f avx512vl avx512_vnni", ("-mavx512vnni", "-mavx512vl")),
        ("fpu avx2 avx_vnni avx512vl avx512_vnni", ("-mavxvnni",)),
        ("fpu avx2 avx512_vnni", ()),  # no 256-bit form without VL
    ]:
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        assert qkernel.host_flags(cpuinfo) == want
    assert qkernel.host_flags(tmp_path / "absent") == ()


@pytest.mark.skipif(qkernel.why_not() is not None, reason=str(qkernel.why_not()))
@pytest.mark.skipif(not qkernel.host_flags(), reason="this CPU has no VNNI: one build only")
def test_the_vnni_build_gives_the_plain_builds_bits(tmp_path: Path) -> None:
    host = qkernel.load()
    assert host is not None
    plain_path = tmp_path / "plain.so"
    cxx = qkernel._compiler()
    assert cxx is not None
    subprocess.run([cxx, *qkernel.FLAGS, *map(str, qkernel.SOURCES), "-o", str(plain_path)],
                   check=True)  # fmt: skip
    plain = qkernel.Kernel(plain_path)
    gen = torch.Generator().manual_seed(0)
    for bits in (4, 8):
        w, b = torch.randn(64, 256, generator=gen), torch.randn(64, generator=gen)
        layer = QuantLinear(quantize(w, bits), b)
        for rows in (1, 3, 9):  # the kernel's 1-row pass, a partial and whole 4-row passes
            x = torch.randn(rows, 256, generator=gen) * 5
            args = (layer.qweight, layer.scales, layer.mins, layer.bias, bits)
            assert torch.equal(host.bind(*args)(x), plain.bind(*args)(x))
