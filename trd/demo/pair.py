"""The demo pairs `tokenrouterd --demo` serves and the benchmarks run on.

qwen  Qwen2.5-Coder-0.5B-Instruct (small) and Qwen2.5-Coder-1.5B-Instruct (large),
      imported in bfloat16 from the GGUF parts the `demo` extra installs (`trd.demo.qwen`)
tiny  the test fixtures: two Qwen3-shaped models of 1 and 6 layers, hidden size 64

With quantization int8 / int4 the qwen pair is imported quantised from the GGUF blocks
(its own cache folders) and served with float32 activations: on CPUs without native
bfloat16 arithmetic (AVX2), float32 is the faster of the two around the quantised
kernels (`tokenrouterd bench step`); the fixtures are quantised at load. A spec
`SMALL,LARGE` (`int8,int4`) gives each model its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
QUANTIZATIONS = ("none", "int8", "int4")
# Whether --demo's large model verifies the small one's proposals and writes every request
# that asks no routing of its own (`--speculate`): the 1.5B's own greedy tokens, faster
# (trd/engines/speculate.py, docs/demo.md). Off for the fixtures, whose tests route.
SPECULATE = {"qwen": True, "tiny": False}
# The weights `tokenrouterd --demo` serves unless --quantization says otherwise: the Qwen
# 0.5B in int8 and the 1.5B in int4, the fastest whose HumanEval pass@1 stays within 2
# points of its bfloat16 import's (the 0.5B's int4 loses 5.5: most of its blocks are 5-bit
# in the file; the 1.5B's int4 is its Q4_K blocks as they are: docs/quantization.md); the
# fixtures as built.
DEMO_QUANTIZATION = {"qwen": "int8,int4", "tiny": "none"}


def pair_modes(spec: str) -> dict[str, str]:
    """A --quantization spec: one mode for both models, or SMALL,LARGE (`int8,int4`)."""
    modes = spec.split(",")
    if len(modes) not in (1, 2) or any(m not in QUANTIZATIONS for m in modes):
        raise ValueError(f"{spec!r} is not MODE or SMALL,LARGE, each one of "
                         f"{', '.join(QUANTIZATIONS)}")  # fmt: skip
    return {"small": modes[0], "large": modes[-1]}


@dataclass(frozen=True, slots=True)
class DemoPair:
    name: str
    models: dict[str, Path]  # {"small": folder, "large": folder}
    threshold: float
    max_model_len: int
    dtype: str
    quantization: str = "none"  # a spec: MODE, or SMALL,LARGE
    # policy.request_large_share (`--request-share S`), off (None) by default: held at 0.3
    # per request (the budget of the project's quality target, docs/quality.md) the routed
    # Qwen pair passed 67.7% of HumanEval against 62.8% at the threshold alone, but made
    # tokens a quarter to a third slower than at the threshold and slower than our 1.5B
    # alone on 2 AMD cores (28.6 vs 31.2 tok/s at one request, 101.3 vs 148.5 at sixteen:
    # each large token costs the 0.5B step that found it unsure, a handoff each way and a
    # 1.5B step over the suffix; results/2026-12-07-compare-baseline-amd/, docs/benchmarks.md).
    request_share: float | None = None
    # The large model loads the small one as its draft (models[].draft); requests without
    # routing are its (policy.request_model), unless a share is asked for.
    speculate: bool = False

    @property
    def modes(self) -> dict[str, str]:
        return pair_modes(self.quantization)

    def policy(self, large_share: float | None = None) -> dict[str, Any]:
        """The demo's routing policy: R-Stitch at the pair's threshold, each request holding
        `request_share`; with `large_share`, the share control holds that over all traffic
        instead; with neither and `speculate`, each request is the large model's."""
        policy: dict[str, Any] = {"name": "rstitch", "threshold": self.threshold}
        if large_share is not None:
            policy["target_large_share"] = large_share
        elif self.request_share is not None:
            policy["request_large_share"] = self.request_share
        elif self.speculate:
            policy["request_model"] = "large"
        return policy


def ensure_demo_pair(
    name: str = "qwen", cache_dir: Path | None = None, quantization: str = "none"
) -> DemoPair:
    """The pair's folders, imported / built into the cache once if missing; `quantization`
    a spec (`pair_modes`)."""
    modes = pair_modes(quantization)
    quantised = set(modes.values()) != {"none"}
    dtype = DTYPE[name] if name in DTYPE and not quantised else "float32"
    if name == "tiny":
        from trd.testing.tinymodels.build import ensure_models

        models = ensure_models(cache_dir, names=("small", "large"))
    elif name == "qwen":
        from trd.demo.qwen import ensure_qwen_pair

        models = ensure_qwen_pair(cache_dir, modes)
    else:
        raise ValueError(f"demo pair {name!r} is not one of {', '.join(DEMOS)}")
    return DemoPair(name, models, RSTITCH_TAU[name], MAX_MODEL_LEN[name], dtype, quantization,
                    speculate=SPECULATE[name])  # fmt: skip
