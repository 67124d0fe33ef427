"""What `bench compare --plan gpu` measures, its dry run, and where each stage finds things.

The plan (`GpuPlan`): the shaped pair at published depth (Qwen3-0.6B + 8B; the demo
pair's Qwen2.5-0.5B + 1.5B shapes after everything else, if time allows), the large
share of each routed run (10% and 30%: a seeded pseudo-random owner per position, the
ensemble policy's draw, so every system writes the same tokens), N, the output length,
the daemons to start (MPS on or off, a share each), and the time of each stage inside
the run's budget. `gpu_dry` is the same plan cut to the CPU (float32, tiny shapes of the
same construction, one daemon without MPS, named as the main one so that the targets are
computed) that CI runs, its time limits stretched for a busy 2-core host; its numbers
mean nothing.

`Ctx` is one run's plan plus its folders (WORK: checkpoints and each stage's JSON; OUT:
logs), written to WORK/ctx.json for the stage processes.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trd.testing.shaped import SHAPES, Shape, tiny

# (name, MPS on, large share): each a daemon of its own, in this order
Daemon = tuple[str, bool, float]


@dataclass(frozen=True)
class GpuPlan:
    pair: tuple[str, str] = ("0.6b", "8b")  # trd.testing.shaped.SHAPES keys: small, large
    extra_pair: tuple[str, str] | None = ("qwen2.5-0.5b", "qwen2.5-1.5b")
    layers: int = 0  # 0: the published depth
    ns: tuple[int, ...] = (1, 4, 16, 32)
    max_tokens: int = 256
    long_tokens: int = 1024  # the first daemon also runs these at long_ns
    long_ns: tuple[int, ...] = (1, 16)
    prompt_tokens: int = 128
    seed: int = 7  # the owners' draw
    daemons: tuple[Daemon, ...] = (
        ("tokenrouterd", True, 0.1), ("tokenrouterd_nomps", False, 0.1),
        ("tokenrouterd", True, 0.3),
    )  # fmt: skip
    official_prompts: int = 4  # the transformers loop, per share (one request at a time)
    generate_ns: tuple[int, ...] = (1, 4, 16, 32)  # transformers' generate, the large alone
    policies: tuple[str, ...] = ("rstitch", "citer", "r2r", "collm", "glimp")
    policy_requests: int = 16
    policy_tokens: int = 64
    policy_share: float = 0.25  # every policy request's routing.large_share
    budget_s: float = 480.0
    slack: float = 1.0  # stretches every stage's time limit (run.py LIMITS)
    dry_run: bool = False

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    @property
    def dtype(self) -> str:
        return "float32" if self.dry_run else "bfloat16"

    @property
    def shares(self) -> tuple[float, ...]:
        return tuple(sorted({share for _, _, share in self.daemons}))

    def requests(self, n: int) -> int:
        """Requests of a run at N: two rounds (one at N=1 would time a single request)."""
        return 2 * n

    def shape(self, key: str) -> Shape:
        s = SHAPES[key]
        if self.dry_run:
            return tiny(s, self.layers or 2)
        return dataclasses.replace(s, layers=self.layers) if self.layers else s


PLANS = {
    "gpu": GpuPlan(),
    "gpu_dry": GpuPlan(
        extra_pair=None, layers=2, ns=(1, 2), max_tokens=12, long_tokens=24, long_ns=(2,),
        prompt_tokens=16, daemons=(("tokenrouterd", False, 0.3),), official_prompts=2,
        generate_ns=(1, 2), policy_requests=3, policy_tokens=12, budget_s=900.0, slack=3.0,
        dry_run=True,
    ),
}  # fmt: skip


@dataclass
class Ctx:
    plan: GpuPlan
    work: Path  # checkpoints, ctx.json, each stage's JSON
    out: Path  # the result, summary.txt, log.txt, the daemons' logs
    notes: dict[str, Any] = field(default_factory=dict)  # e.g. why WORK is where it is

    @property
    def shaped(self) -> Path:
        return self.work / "shaped"

    def model(self, key: str) -> Path:
        return self.shaped / self.plan.shape(key).name

    def pair_paths(self, extra: bool = False) -> dict[str, Path]:
        keys = self.plan.extra_pair if extra else self.plan.pair
        assert keys is not None
        return {"small": self.model(keys[0]), "large": self.model(keys[1])}

    def stage_json(self, name: str) -> Path:
        return self.work / f"{name}.json"

    def read(self, name: str) -> dict[str, Any]:
        """An earlier stage's result ({} when it wrote none)."""
        path = self.stage_json(name)
        return json.loads(path.read_text()) if path.exists() else {}

    def save(self) -> Path:
        path = self.work / "ctx.json"
        body = {"plan": dataclasses.asdict(self.plan), "work": str(self.work),
                "out": str(self.out), "notes": self.notes}  # fmt: skip
        path.write_text(json.dumps(body, indent=1))
        return path

    @classmethod
    def load(cls, path: Path) -> Ctx:
        body = json.loads(path.read_text())
        fields = {f.name: f.type for f in dataclasses.fields(GpuPlan)}
        plan = {k: _untuple(v) if "tuple" in str(fields[k]) else v
                for k, v in body["plan"].items()}  # fmt: skip
        return cls(GpuPlan(**plan), Path(body["work"]), Path(body["out"]), body["notes"])


def _untuple(value: Any) -> Any:
    """JSON's lists back to the plan's (nested) tuples."""
    return tuple(_untuple(v) for v in value) if isinstance(value, list) else value
