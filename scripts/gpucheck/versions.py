"""Versions and the device: torch, CUDA, nvcc, ninja, flashinfer, driver, compute
capability, the MPS binary (and the driver it belongs to): what this run checked.

python -m gpucheck.versions OUT.json
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any

import psutil
import torch

from gpucheck.common import DRY_RUN, dump
from gpucheck.mps import find_control
from trd.mps.driver import binary_versions, driver_version


def command(*args: str) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    return (done.stdout or done.stderr).strip()


def versions() -> dict[str, Any]:
    control = find_control()
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
        "dry_run": DRY_RUN,
    }  # fmt: skip
    try:
        import flashinfer

        info["flashinfer"] = flashinfer.__version__
    except ImportError as exc:
        info["flashinfer"] = f"not importable: {exc}"
    if info["cuda_available"]:
        info["device"] = torch.cuda.get_device_name(0)
        info["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return info


def main() -> None:
    info = versions()
    ok = DRY_RUN or (info["cuda_available"] and not str(info["flashinfer"]).startswith("not"))
    dump(sys.argv[1], {"ok": ok, **info})


if __name__ == "__main__":
    main()
