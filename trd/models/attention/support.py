"""Which attention backend runs a model: flashinfer where its kernels exist, else torch.

flashinfer 0.6 (the `gpu` extra's pin) runs a model when

    dtype      bfloat16 or float16 (its dtype maps have no float32/float64 entry)
    head_dim   64, 128 or 256: its FA2 prefill kernels, which the tensor-core decode uses
               too, are invalid below 64 (`KernelTraits::IsInvalid`, NUM_MMA_D_VO < 4 in
               prefill.cuh) and read out of bounds for sizes that are not multiples of 64
               (flashinfer issue 4299)
    page size  any: the kernels take it at run time
    heads      any query/KV ratio (tensor-core decode; the plain decode has 1-8 only)

`auto` picks flashinfer on CUDA when it is installed and the model fits, else torch with
the reason (the engine logs it, `tokenrouterd --check` prints it); `flashinfer` for a
model it cannot run is refused with the reason. The memory plan reserves flashinfer's
workspaces and the CUDA graphs (which need it) only for the models that get it.
"""

from __future__ import annotations

import importlib.util

from trd.engines.spec import ATTENTION_BACKENDS, FLASHINFER_DTYPES
from trd.models.checkpoint import ModelConfig

FLASHINFER_HEAD_DIMS = (64, 128, 256)


def flashinfer_gap(cfg: ModelConfig, dtype: str) -> str:
    """Why flashinfer's kernels cannot run this model in `dtype`; "" when they can."""
    if dtype not in FLASHINFER_DTYPES:
        return f"dtype {dtype}: flashinfer runs {' and '.join(FLASHINFER_DTYPES)} only"
    if cfg.head_dim not in FLASHINFER_HEAD_DIMS:
        dims = ", ".join(map(str, FLASHINFER_HEAD_DIMS))
        return f"head_dim {cfg.head_dim}: flashinfer's kernels exist for head_dim {dims} only"
    return ""


def flashinfer_installed() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def choose_backend(setting: str, device: str, cfg: ModelConfig, dtype: str) -> tuple[str, str]:
    """(backend, why) for engine.attention `setting` on `device` ("cpu", "cuda[:N]").

    Raises ValueError for a setting that cannot run: unknown, or flashinfer off CUDA or
    for a model its kernels do not cover."""
    if setting not in ATTENTION_BACKENDS:
        raise ValueError(f"unknown attention backend {setting!r} (choose auto, torch or "
                         "flashinfer)")  # fmt: skip
    cuda = device.startswith("cuda")
    if setting == "flashinfer":
        if not cuda:
            raise ValueError("engine.attention: flashinfer: the flashinfer backend needs a "
                             "CUDA device")  # fmt: skip
        gap = flashinfer_gap(cfg, dtype)
        if gap:
            raise ValueError(f"engine.attention: flashinfer: {gap}; set auto or torch")
        return "flashinfer", "as configured"
    if setting == "torch":
        return "torch", "as configured"
    if not cuda:
        return "torch", "not on CUDA"
    if not flashinfer_installed():
        return "torch", "flashinfer is not installed (pip install 'tokenrouterd[gpu]')"
    gap = flashinfer_gap(cfg, dtype)
    return ("torch", gap) if gap else ("flashinfer", "its kernels cover this model")
