"""The model pair a benchmark runs on, chosen with `--pair`.

    demo  the real pair: SmolLM2-135M-Instruct (large) and the small partner built on its
          tokenizer (`trd.demo.pair.ensure_demo_pair`); chat prompts
    tiny  the fixture Qwen3 pair (`trd.tinymodels`); prompts from held-out fixture text

The JSON records what the pair was (folders and architecture), so the report says it
from the run, not from this file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trd.models.checkpoint import read_checkpoint
from trd.tinymodels.build import ensure_models

from benchkit.workloads import WORKLOADS, Workload

PAIRS = ("demo", "tiny")
# R-Stitch thresholds that give each pair a large-token share of the order the paper's
# runs have (tens of percent). demo: the first real pair measured 57% at 0.4 and 7% at
# 0.6 (/work/shared/reviews/real-pair.md); calibrate again when the small model changes.
DEFAULT_TAU = {"demo": 0.5, "tiny": 0.8}


@dataclass(frozen=True)
class Pair:
    name: str
    models: dict[str, Path]  # {"small": folder, "large": folder}
    workloads: dict[str, Workload]

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "models": {}}
        for role, path in self.models.items():
            cfg = read_checkpoint(path).config
            out["models"][role] = {
                "folder": path.name, "model_type": cfg.model_type, "layers": cfg.num_layers,
                "hidden": cfg.hidden_size, "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads,
                "vocab": cfg.vocab_size,
            }  # fmt: skip
        return out


def load_pair(name: str, cache_dir: Path | None = None) -> Pair:
    """The pair's checkpoint folders, built or imported into the cache first if missing."""
    if name == "tiny":
        return Pair(name, ensure_models(cache_dir, names=("small", "large")), WORKLOADS[name])
    if name != "demo":
        raise ValueError(f"--pair: {name!r} is not one of {', '.join(PAIRS)}")
    try:
        from trd.demo.pair import ensure_demo_pair
    except ImportError as exc:
        raise SystemExit(
            f"--pair demo: {exc}; this tree has no trd/demo/pair.py (the demo pair's builder)"
            " yet. Use --pair tiny."
        ) from None
    found = ensure_demo_pair()
    return Pair(name, {"small": found["small"], "large": found["large"]}, WORKLOADS[name])
