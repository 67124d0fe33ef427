"""Cost of one decoder layer's linears by path: torch bfloat16, torch's weight-only int8
and int4 (group 32), fbgemm's dynamic int8 (torch.ao), and ours in 4 and 8 bits.

The layers have Qwen2.5-Coder-1.5B's shapes (q, k, v, o, gate, up, down); `--layers`
distinct copies are cycled so that the weights come from memory, not the cache, as in a
step. Prints the median per layer (wall and CPU time of this process), writes JSON with
the machine's load average.

    python scripts/bench_qlinear.py [--layers 8] [--rows 1,4,16,64] [--threads 1] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trd.models.qformat import quantize
from trd.models.qlinear import QuantLinear

H, M = 1536, 8960  # hidden, intermediate
SHAPES = [(H, H), (256, H), (256, H), (H, H), (M, H), (M, H), (H, M)]  # (out, in)


def _int8_weight_only(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = w.abs().amax(1) / 127
    return torch.round(w / s[:, None]).to(torch.int8), s.to(torch.bfloat16)


def _int4_weight_only(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's CPU int4 layout: w = (q - 8) * s + z per group of 32."""
    qt = quantize(w, 4)
    s, m = qt.scales.float(), qt.mins.float()  # type: ignore[union-attr]
    pairs = torch.stack((s.t(), (8 * s - m).t()), -1).to(torch.bfloat16).contiguous()
    return torch._convert_weight_to_int4pack_for_cpu(qt.values().to(torch.int32), 1), pairs


def _fbgemm(w: torch.Tensor) -> Any:
    s = (w.abs().amax(1) / 127).double()
    zero = torch.zeros(w.shape[0], dtype=torch.long)
    qw = torch.quantize_per_channel(w, s, zero, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(qw, None)


Path_ = tuple[Callable[[torch.Tensor], Any], Callable[[torch.Tensor, Any], Any], torch.dtype]
PATHS: dict[str, Path_] = {
    "bf16": (lambda w: w.bfloat16(), lambda x, w: F.linear(x, w), torch.bfloat16),
    "torch_int8_wo": (_int8_weight_only, lambda x, w: torch._weight_int8pack_mm(x, *w),
                      torch.bfloat16),
    "torch_int4_wo": (_int4_weight_only,
                      lambda x, w: torch._weight_int4pack_mm_for_cpu(x, w[0], 32, w[1]),
                      torch.bfloat16),
    "fbgemm_dyn_int8": (_fbgemm, lambda x, p: torch.ops.quantized.linear_dynamic(x, p),
                        torch.float32),
    "ours_4bit": (lambda w: QuantLinear(quantize(w, 4), None), lambda x, m: m(x), torch.float32),
    "ours_8bit": (lambda w: QuantLinear(quantize(w, 8), None), lambda x, m: m(x), torch.float32),
}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--rows", default="1,4,16,64")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.backends.quantized.engine = "x86"
    warnings.filterwarnings("ignore")  # torch.quantize_per_channel's deprecation
    gen = torch.Generator().manual_seed(0)
    raw = [[torch.randn(n, k, generator=gen) * 0.02 for n, k in SHAPES]
           for _ in range(args.layers)]  # fmt: skip
    built = {
        name: [[make(w) for w in layer] for layer in raw] for name, (make, _, _) in PATHS.items()
    }
    del raw
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    loads = [os.getloadavg()[0]]
    with torch.inference_mode():
        for _ in range(args.rounds):
            for rows in (int(r) for r in args.rows.split(",")):
                for name, (_, call, dtype) in PATHS.items():
                    xs = {k: torch.randn(rows, k, dtype=dtype) for k in (H, M)}
                    w, c = time.perf_counter(), time.process_time()
                    for layer in built[name]:
                        for (_, k), weight in zip(SHAPES, layer, strict=True):
                            call(xs[k], weight)
                    key = f"{name}@{rows}"
                    wall.setdefault(key, []).append((time.perf_counter() - w) / args.layers)
                    cpu.setdefault(key, []).append((time.process_time() - c) / args.layers)
            loads.append(os.getloadavg()[0])
    result = {
        "shapes": SHAPES, "layers": args.layers, "threads": args.threads,
        "load_avg_1m": loads, "cpus": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "median_ms_per_layer": {k: 1e3 * statistics.median(t) for k, t in wall.items()},
        "median_cpu_ms_per_layer": {k: 1e3 * statistics.median(t) for k, t in cpu.items()},
    }  # fmt: skip
    for key, ms in result["median_ms_per_layer"].items():
        print(f"{key:22s} {ms:8.2f} ms  (cpu {result['median_cpu_ms_per_layer'][key]:7.2f} ms)")
    print(f"load average (1 min) during the run: {min(loads):.1f} .. {max(loads):.1f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
