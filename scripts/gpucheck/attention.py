"""flashinfer against the torch backend on a float32 copy, every case of
trd/testing/attention_cases.py for the published head shapes; the two kernel modules
(head_dim 64 and 128) compiled at once first, for every later stage.

    python -m gpucheck.attention OUT.json      (on a GPU: flashinfer, bfloat16)
"""

from __future__ import annotations

import sys

import torch

from gpucheck.common import DRY_RUN, dump
from trd.testing.attention_cases import TOLERANCE, check_all, compile_kernels, fallback


def main() -> None:
    name, dtype, dev = ("torch", torch.float32, "cpu") if DRY_RUN else (
        "flashinfer", torch.bfloat16, "cuda")  # fmt: skip
    compiled = compile_kernels(name, dtype, dev)
    rows = check_all(name, dtype, dev)
    small = fallback(dev)
    ok = all(r["ok"] for r in rows) and small == "torch"
    dump(sys.argv[1], {"ok": ok, "tolerance": TOLERANCE, "compile_s": compiled,
                       "head_dim_32_backend": small, "cases": rows})  # fmt: skip


if __name__ == "__main__":
    main()
