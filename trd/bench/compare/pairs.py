"""The model pair a benchmark runs on, chosen with `--pair`.

    demo  the real pair: Qwen2.5-Coder-0.5B-Instruct (small) and 1.5B-Instruct (large),
          imported from their GGUF parts (`trd.demo.pair`); chat prompts
    tiny  the fixture Qwen3 pair (`trd.testing.tinymodels`); prompts from held-out fixture text

The JSON records what the pair was (folders and architecture), so the report says it
from the run, not from this file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trd.bench.compare.workloads import WORKLOADS, Workload
from trd.demo.pair import RSTITCH_TAU, ensure_demo_pair
from trd.models.checkpoint import read_checkpoint

PAIRS = ("demo", "tiny")
# The bench's pair names -> `trd.demo.pair`'s (whose R-Stitch thresholds give the large
# model 10-30% of the tokens).
_DEMO_NAMES = {"demo": "qwen", "tiny": "tiny"}
DEFAULT_TAU = {name: RSTITCH_TAU[demo] for name, demo in _DEMO_NAMES.items()}


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
    if name not in _DEMO_NAMES:
        raise ValueError(f"--pair: {name!r} is not one of {', '.join(PAIRS)}")
    found = ensure_demo_pair(_DEMO_NAMES[name], cache_dir)
    return Pair(name, found.models, WORKLOADS[name])
