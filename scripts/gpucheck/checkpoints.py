"""The shaped pair, written for the other stages: Qwen3-0.6B and Qwen3-8B shapes with
LAYERS layers each (common.py), random weights built so greedy decoding writes a known
token (trd/testing/shaped.py), drawn on the device.

    python -m gpucheck.checkpoints OUT.json
"""

from __future__ import annotations

import sys
import time

from gpucheck.common import DEVICE, WORK, dump, log, shapes
from trd.testing.shaped import write_checkpoint


def main() -> None:
    rows = {}
    for which, shape in shapes().items():
        start = time.perf_counter()
        path = write_checkpoint(shape, WORK / "shaped", DEVICE)
        size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        rows[which] = {"path": str(path), "params": shape.num_params(), "bytes": size,
                       "seconds": round(time.perf_counter() - start, 1)}  # fmt: skip
        log(f"{which}: {rows[which]}")
    dump(sys.argv[1], {"ok": True, "models": rows})


if __name__ == "__main__":
    main()
