"""One stage of the GPU plan in a process of its own (run.py starts them).

    python -m trd.bench.gpu.stage KIND CTX.json OUT.json [ARGS...]

KIND: versions, checkpoints, kernels, stepcost, routed (ARGS: name, mps|nomps, share,
first|other, main|extra), hf (ARGS: its time limit in seconds), policies. The stage
writes its measurements to OUT.json as it goes (trd/bench/stages.py `Partial`) and
"ok" last: whether what it checked held. Only the stage's own module is imported (a
process that imports torch, transformers and the engines for nothing starts seconds
later on a busy host).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

from trd.bench.gpu.plan import Ctx
from trd.bench.stages import Partial

# kind -> "module:function"; the function takes (ctx, out, args) and says whether it held
STAGES = {
    "versions": "trd.bench.gpu.versions:stage", "checkpoints": "trd.bench.gpu.prepare:checkpoints",
    "kernels": "trd.bench.gpu.prepare:kernels", "stepcost": "trd.bench.gpu.bounds:stage",
    "routed": "trd.bench.gpu.routed:stage", "hf": "trd.bench.gpu.hf:stage",
    "policies": "trd.bench.gpu.policies:stage",
}  # fmt: skip


def main(argv: list[str]) -> int:
    kind, ctx_path, out_path, *args = argv
    out = Partial(out_path)
    ctx = Ctx.load(Path(ctx_path))
    if ctx.plan.dry_run:
        torch.set_num_threads(1)  # the CI host's other core runs the tests
    module, function = STAGES[kind].split(":")
    ok = getattr(importlib.import_module(module), function)(ctx, out, args)
    out.put("ok", bool(ok))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
