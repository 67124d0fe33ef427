"""`bench compare --plan gpu`: every stage of the GPU plan in order, inside one budget.

    stage            limit  what                           (guessed: not yet run on a GPU)
    versions           60   what ran                                          ~10 s
    checkpoints       150   the shaped pairs, published depth     } at once   ~30 s
    kernels           240   flashinfer's modules, compiled        }           ~35 s
    stepcost          120   bandwidth; each engine alone at every N           ~30 s
    routed-1          150   tokenrouterd, MPS, 10%; the large alone; 1,024    ~60 s
    hf                180   the transformers loop; generate (static cache)    ~80 s
    routed-2, -3      120   tokenrouterd without MPS at 10%; MPS at 30%   ~45 s each
    policies          150   each policy, graphs on vs off                     ~60 s
    routed-demo       120   the demo pair's shapes, MPS, 10%                  ~45 s

A stage the budget (the plan's, 480 s: one device call of 9 minutes with the device's
start and the wheels' install around it) no longer allows is reported as not run; the
result, OUT/summary.txt and OUT/table.md are rewritten after every stage (report.py),
so a run cut off returns what it measured. WORK (the checkpoints: 22 GB) is /dev/shm
when it has room, else /tmp; the dry run's is beside the result.

Exit status: 0 every stage passed; 1 one failed or did not run; 3 no CUDA device.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from trd.bench.gpu import report
from trd.bench.gpu.plan import PLANS, Ctx, GpuPlan
from trd.bench.result import Result
from trd.bench.stages import Stages, log

NO_DEVICE = 3
# stage kind -> (time limit s, least budget left to start it s)
LIMITS = {"versions": (60, 10), "checkpoints": (150, 60), "kernels": (240, 60),
          "stepcost": (120, 30), "routed-1": (150, 60), "hf": (180, 60), "routed": (120, 45),
          "policies": (150, 45)}  # fmt: skip


def work_dir(plan: GpuPlan, out: Path) -> tuple[Path, str]:
    if plan.dry_run:
        return out / "work", "dry run: beside the result"
    keys = [*plan.pair, *(plan.extra_pair or ())]
    need = sum(2 * plan.shape(k).num_params() for k in keys)
    shm = Path("/dev/shm")
    free = shutil.disk_usage(shm).free if shm.is_dir() else 0
    if free > 1.2 * need:
        return shm / "trd_gpu_bench", f"/dev/shm: {free / 1e9:.0f} GB free, {need / 1e9:.0f} needed"
    return Path("/tmp/trd_gpu_bench"), f"/tmp: /dev/shm has {free / 1e9:.0f} GB free"


def stage_order(plan: GpuPlan) -> list[str]:
    names = ["versions", "checkpoints", "kernels", "stepcost"]
    routed = [f"routed-{i + 1}" for i in range(len(plan.daemons))]
    names += [*routed[:1], "hf", *routed[1:], "policies"]
    return names + (["routed-demo"] if plan.extra_pair else [])


def run_gpu(plan_name: str, out: Path, command: list[str]) -> int:
    plan = PLANS[plan_name]
    out = out.absolute()
    work, why = work_dir(plan, out.parent)
    ctx = Ctx(plan, work, out.parent, {"work": why})
    order = stage_order(plan)
    result = Result("bench compare", command)
    stages = Stages(out.parent, plan.budget_s, work,
                    lambda r: report.write(ctx, result, out, r, order))  # fmt: skip
    ctx_path = ctx.save()

    def argv(kind: str, name: str, *args: object) -> list[str]:
        return [sys.executable, "-m", "trd.bench.gpu.stage", kind, str(ctx_path),
                str(stages.result_path(name)), *map(str, args)]  # fmt: skip

    def step(name: str, kind: str, *args: object) -> None:
        limit, need = LIMITS.get(name, LIMITS[kind])
        stages.step(name, limit * plan.slack, argv(kind, name, *args), need)

    step("versions", "versions")
    if not plan.dry_run and not stages.results["versions"].get("cuda_available"):
        stages.results["status"] = "NO DEVICE: no CUDA device, nothing was measured"
        stages.save()
        return NO_DEVICE
    shaped = stages.start("checkpoints", argv("checkpoints", "checkpoints"))
    kernels = stages.start("kernels", argv("kernels", "kernels"))
    stages.finish(shaped, LIMITS["checkpoints"][0] * plan.slack)
    stages.finish(kernels, LIMITS["kernels"][0] * plan.slack)
    step("stepcost", "stepcost")
    for i, (name, mps, share) in enumerate(plan.daemons):
        step(f"routed-{i + 1}", "routed", name, "mps" if mps else "nomps", share,
             "first" if i == 0 else "other", "main")  # fmt: skip
        if i == 0:  # the stage stops starting work 10 s before its limit
            step("hf", "hf", round(min(LIMITS["hf"][0] * plan.slack, stages.left_s) - 10))
    step("policies", "policies")
    if plan.extra_pair:
        name, mps, share = plan.daemons[0]
        step("routed-demo", "routed", name, "mps" if mps else "nomps", share, "other", "extra")
    stages.save()
    failed = [k for k, v in stages.results.items() if isinstance(v, dict) and not v.get("ok")]
    log(f"done: {'every stage passed' if not failed else 'failed: ' + ', '.join(failed)}; "
        f"{out}, {out.parent / 'summary.txt'}")  # fmt: skip
    return 1 if failed else 0
