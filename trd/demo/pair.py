"""The demo pairs `tokenrouterd --demo` serves and the benchmarks run on.

qwen  Qwen2.5-Coder-0.5B-Instruct (small) and Qwen2.5-Coder-1.5B-Instruct (large),
      imported in bfloat16 from the GGUF parts the `demo` extra installs (`trd.demo.qwen`)
tiny  the test fixtures: two Qwen3-shaped models of 1 and 6 layers, hidden size 64

With quantization int8 / int4 the qwen pair is imported quantised from the GGUF blocks
(its own cache folders) and served with float32 activations: on CPUs without native
bfloat16 arithmetic (AVX2), float32 is the faster of the two around the quantised
kernels (`tokenrouterd bench step`); the fixtures are quantised at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEMOS = ("qwen", "tiny")
# R-Stitch thresholds (on the small model's normalised entropy) that leave the large model
# 10-30% of the output tokens. qwen: on the 16 chat and code questions of
# `tokenrouterd eval calibrate` the 0.5B is unsure (H > tau) at 20.5% of its greedy positions
# at 0.1 (37% at 0.05, 6% at 0.2; docs/demo.md); `tokenrouterd eval demo` reports the
# share of the routed answers to its ten questions. Fixed, not the share control, so that
# a question gets the same answer whatever traffic came before (`--large-share` holds a
# share instead). Code alone makes the 0.5B surer: HumanEval needs a lower tau for the same
# share. tiny: on held-out fixture text (`tokenrouterd bench engines`,
# `trd.evals.calibrate.bisect`).
RSTITCH_TAU = {"qwen": 0.1, "tiny": 0.82}
# Longest prompt + output the demo serves: the fixtures were trained on 128-token windows
# with a 1024-position RoPE table; Qwen2.5 has 32768 positions, 4096 keeps the KV small.
MAX_MODEL_LEN = {"qwen": 4096, "tiny": 1024}
# The served dtype: the Qwen pair is stored in bfloat16; the fixtures' tests are float32.
DTYPE = {"qwen": "bfloat16", "tiny": "float32"}
# The weights `tokenrouterd --demo` serves unless --quantization says otherwise: the Qwen
# pair in int8 (its logits closest to the bfloat16 import's, at a fraction of the step
# cost: docs/quantization.md); the fixtures as built.
DEMO_QUANTIZATION = {"qwen": "int8", "tiny": "none"}


@dataclass(frozen=True, slots=True)
class DemoPair:
    name: str
    models: dict[str, Path]  # {"small": folder, "large": folder}
    threshold: float
    max_model_len: int
    dtype: str
    quantization: str = "none"


def ensure_demo_pair(
    name: str = "qwen", cache_dir: Path | None = None, quantization: str = "none"
) -> DemoPair:
    """The pair's folders, imported / built into the cache once if missing."""
    dtype = DTYPE[name] if name in DTYPE and quantization == "none" else "float32"
    if name == "tiny":
        from trd.testing.tinymodels.build import ensure_models

        models = ensure_models(cache_dir, names=("small", "large"))
    elif name == "qwen":
        from trd.demo.qwen import ensure_qwen_pair

        models = ensure_qwen_pair(cache_dir, quantization)
    else:
        raise ValueError(f"demo pair {name!r} is not one of {', '.join(DEMOS)}")
    return DemoPair(name, models, RSTITCH_TAU[name], MAX_MODEL_LEN[name], dtype, quantization)
