"""What ran: Python, torch, CUDA, nvcc, ninja, flashinfer, the driver, the device and its
compute capability, the MPS control binary and the driver it belongs to. The GPU check's
versions stage and `bench compare --plan gpu` both record this.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import torch

from trd.bench.gpu.plan import Ctx
from trd.bench.stages import Partial
from trd.mps.driver import binary_versions, driver_version, find_control


def command(*args: str) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    return (done.stdout or done.stderr).strip()


def versions(mps_dirs: Sequence[Path] = ()) -> dict[str, Any]:
    """Every version above; `mps_dirs`: more folders where the MPS binary may be."""
    control = find_control(mps_dirs)
    info: dict[str, Any] = {
        "python": platform.python_version(), "kernel": platform.release(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "nvcc": command("nvcc", "--version").splitlines()[-1:],
        "cuda_home": os.environ.get("CUDA_HOME", ""),
        "ninja": f"{shutil.which('ninja')} {command('ninja', '--version')}",
        "psutil": psutil.__version__,
        "nvidia_smi": command("nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"),
        "mps_control": str(control), "driver": driver_version(),
        "mps_binary_versions": sorted(binary_versions(control)) if control else [],
    }  # fmt: skip
    try:
        import transformers

        info["transformers"] = transformers.__version__
        import flashinfer

        info["flashinfer"] = flashinfer.__version__
    except ImportError as exc:
        info["flashinfer"] = f"not importable: {exc}"
    if info["cuda_available"]:
        info["device"] = torch.cuda.get_device_name(0)
        info["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return info


def stage(ctx: Ctx, out: Partial, args: list[str]) -> bool:
    """The versions stage of the GPU plan: it ran on a device with flashinfer (dry: any)."""
    info = versions()
    for key, value in info.items():
        out.put(key, value)
    flashinfer = not str(info.get("flashinfer")).startswith("not")
    return ctx.plan.dry_run or (info["cuda_available"] and flashinfer)
