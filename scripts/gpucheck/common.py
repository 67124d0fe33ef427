"""What every stage shares: the paths, the models and the mode (progress lines and JSON
results: trd/bench/stages.py).

The check runs on a GPU (bfloat16 on cuda, the shaped pair: the published Qwen3-0.6B and
-8B shapes with a few layers) or, with GPU_CHECK_DRY_RUN=1, on the CPU (float32, the
same construction at a tiny size), so CI walks every stage's code without a device.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from trd.bench.stages import dump, log
from trd.testing.shaped import SHAPES, Shape, tiny

__all__ = ["dump", "log"]  # every stage takes them from here
REPO = Path(__file__).resolve().parents[2]  # the checkout the check runs from
# Where the stages put their results and the shaped checkpoints (set by gpu_check.sh).
WORK = Path(os.environ.get("GPU_CHECK_WORK", "/tmp/gpu_check"))
DRY_RUN = os.environ.get("GPU_CHECK_DRY_RUN") == "1"
DEVICE, DTYPE = ("cpu", "float32") if DRY_RUN else ("cuda", "bfloat16")
# Layers of each published shape: enough for the kernels, the graphs and the memory plan,
# written in seconds (the full 8B is 16 GB).
LAYERS = 2


def shapes() -> dict[str, Shape]:
    """small (entry) and large, the pair the routed stages serve, and qwen2-small and
    qwen2-large, the demo pair's shapes (Qwen2: attention biases; the engines stage), as
    written by the checkpoints stage."""
    chosen = {
        "small": SHAPES["0.6b"],
        "large": SHAPES["8b"],
        "qwen2-small": SHAPES["qwen2.5-0.5b"],
        "qwen2-large": SHAPES["qwen2.5-1.5b"],
    }
    chosen = {k: dataclasses.replace(s, layers=LAYERS) for k, s in chosen.items()}
    return {k: tiny(s, LAYERS) for k, s in chosen.items()} if DRY_RUN else chosen


def model_path(which: str) -> Path:
    return WORK / "shaped" / shapes()[which].name


def first_mismatch(a: list[list[int]], b: list[list[int]]) -> str:
    """Where two runs' tokens first differ ("" when equal)."""
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} requests"
    for rid, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            pos = next((i for i, (s, t) in enumerate(zip(x, y, strict=False)) if s != t), None)
            return f"request {rid} position {pos}: {x[:40]} vs {y[:40]}"
    return ""
