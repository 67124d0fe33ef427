"""The quantised-linear CPU kernel (`qkernel.cpp`): built once per host, called through ctypes.

    kernel = load()          # None where it cannot run here; `why_not()` says why
    kernel(x, qweight, scales, mins, bias, out, bits)

torch ships no x86 kernel that multiplies 4-bit weights with int8 activations; its
weight-only int4 and int8 kernels dequantise to floats and are compute-bound at one row.
This one is built with the host's g++ into `<cache base>/kernels/` (a few seconds, once
per source version; concurrent engines wait on one lock and load the same file). It
needs AVX2 with FMA and F16C (x86 since 2013) and a C++ compiler; where either is
missing the quantised layers dequantise their weights and run torch's dense linear.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from trd.models.cache import cache_base

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
SOURCES = tuple(_HERE / name for name in ("qkernel.cpp", "cpu_ops.cpp", "cpu_stack.cpp"))
HEADERS = (_HERE / "cpu_kernels.h",)
GROUP, TILE = 32, 8  # inputs per scale, output rows per tile (qkernel.cpp)
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC")
_PTR, _INT = ctypes.c_void_p, ctypes.c_int
_ARGS = [_PTR, _INT, _INT, _INT, _INT, _INT, _PTR, _PTR, _PTR, _PTR, _PTR, _INT, _INT]


class Kernel:
    """The built library: `trd_qlinear` (`bind`), the float32 glue of cpu_ops.cpp and the
    decode step of cpu_stack.cpp (`lib`, for trd/models/native_stack.py)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lib = lib = ctypes.CDLL(str(path))
        self._fn = lib.trd_qlinear
        self._fn.argtypes = _ARGS  # type: ignore[assignment]  # ctypes' stub is narrower
        self._fn.restype = _INT
        self._norm, self._rope, self._silu_mul, self._attend = (
            lib.trd_rmsnorm,
            lib.trd_rope,
            lib.trd_silu_mul,
            lib.trd_decode_attention,
        )
        self._norm.argtypes = [_PTR, _PTR, ctypes.c_float, _PTR, _INT, _INT]
        self._rope.argtypes = [_PTR, _INT, _INT, _INT, _INT, _PTR, _PTR]
        self._silu_mul.argtypes = [_PTR, _PTR, _INT, _PTR, _INT, _INT]
        self._attend.argtypes = [_PTR, _INT, _PTR, _PTR, _PTR, _INT, _PTR, _PTR, _PTR,
                                 _INT, _INT, _INT, _INT]  # fmt: skip
        for f in (self._norm, self._rope, self._silu_mul, self._attend):
            f.restype = None

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm of contiguous float32 x over its last dimension."""
        out = torch.empty_like(x)
        d = x.shape[-1]
        self._norm(x.data_ptr(), weight.data_ptr(), eps, out.data_ptr(), x.numel() // d, d)
        return out

    def rope_(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Rotate x (T, heads, D) float32 in place (rows may be strided, heads contiguous)
        by cos and the signed sin of `RotaryEmbedding.cos_signed_sin`."""
        t, heads, d = x.shape
        self._rope(x.data_ptr(), t, x.stride(0), heads, d, cos.data_ptr(), sin.data_ptr())

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of float32 (T, I) rows, each contiguous and `gate.stride(0)`
        apart in both (the halves of a fused gate/up output, or two tensors)."""
        t, i = gate.shape
        out = torch.empty(t, i, dtype=gate.dtype)
        self._silu_mul(gate.data_ptr(), up.data_ptr(), gate.stride(0), out.data_ptr(), t, i)
        return out

    def decode_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        rows: torch.Tensor,
        offsets: torch.Tensor,
        slots: torch.Tensor,
    ) -> None:
        """out[rows] = attention of the one-token queries q[rows] (T, H, D; rows strided,
        heads contiguous) over k, v (slots, KVH, D) at slots[offsets[i]:offsets[i+1]]."""
        _, h, d = q.shape
        self._attend(q.data_ptr(), q.stride(0), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                     len(rows), rows.data_ptr(), offsets.data_ptr(), slots.data_ptr(), h,
                     k.shape[1], d, torch.get_num_threads())  # fmt: skip

    def bind(
        self,
        qweight: torch.Tensor,
        scales: torch.Tensor,
        mins: torch.Tensor | None,
        bias: torch.Tensor | None,
        bits: int,
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """A call y = x @ W^T + bias for one weight (x (M, K) contiguous float32 or
        bfloat16, y likewise): its pointers are read once, here, not per call (a decode
        step makes ~100 of these calls, each worth a few microseconds of Python)."""
        n, k = scales.shape[0] * TILE, scales.shape[1] * GROUP
        fn, pw, ps = self._fn, qweight.data_ptr(), scales.data_ptr()
        pm = 0 if mins is None else mins.data_ptr()
        pb = 0 if bias is None else bias.data_ptr()
        threads, bf16 = torch.get_num_threads, torch.bfloat16

        def call(x: torch.Tensor) -> torch.Tensor:
            m, half = x.shape[0], x.dtype == bf16
            y = torch.empty(m, n, dtype=x.dtype)
            if fn(x.data_ptr(), half, m, k, n, bits, pw, ps, pm, pb, y.data_ptr(), half,
                  threads()):  # fmt: skip
                raise MemoryError(f"quantised linear: no memory for {m} x {k} int8 activations")
            return y

        return call


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def why_not() -> str | None:
    """Why the kernel cannot run on this host, or None."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return f"the CPU lacks AVX2 (torch reports {torch.backends.cpu.get_cpu_capability()})"
    if _compiler() is None:
        return "no C++ compiler (g++ or $CXX) to build trd/models/qkernel.cpp"
    return None


def host_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, ...]:
    """What this host's CPU adds to the build: VNNI (one instruction for the kernel's int8
    dot products, the same sums) and, with AVX-512 VNNI, the kernel's pass over two tiles
    in 512-bit registers (qkernel.cpp); none on a plain AVX2 CPU."""
    flags = set(cpuinfo.read_text(errors="replace").split()) if cpuinfo.is_file() else set()
    found = ["-mavxvnni"] if "avx_vnni" in flags else []
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        found += ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]
    return tuple(found)


def _flags() -> tuple[str, ...]:
    return FLAGS + host_flags()


def _target(cxx: str) -> Path:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES + HEADERS))
    digest.update(" ".join(_flags()).encode() + version.encode())
    return cache_base() / "kernels" / f"qkernel-{digest.hexdigest()[:16]}.so"


def compile_library(cxx: str, flags: tuple[str, ...], out: Path) -> None:
    """The library's sources compiled with `flags` into `out`; OSError with the compiler's
    message if it fails."""
    done = subprocess.run([cxx, *flags, *map(str, SOURCES), "-o", str(out)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode:
        raise OSError(f"{cxx} failed on {SOURCES[0].parent}: {done.stderr[-2000:]}")


def _build(cxx: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return  # another engine built it while this one waited
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            compile_library(cxx, _flags(), Path(tmp))
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
            log.info("built the quantised-linear kernel: %s", target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


@functools.cache
def load() -> Kernel | None:
    """The kernel, built first if this host has none yet; None (logged) where it cannot run."""
    reason = why_not()
    if reason is None:
        cxx = _compiler()
        assert cxx is not None
        target = _target(cxx)
        try:
            if not target.exists():
                _build(cxx, target)
            return Kernel(target)
        except OSError as exc:
            reason = str(exc)
    log.warning("quantised linears run dequantised (slow): %s", reason)
    return None
