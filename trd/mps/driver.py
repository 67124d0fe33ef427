"""Whether the MPS binaries belong to the driver that runs the GPU.

nvidia-cuda-mps-control and -server ship with the driver (the driver's own package, or
Debian's nvidia-cuda-mps of one branch) and talk to its kernel module and libcuda: a
server from another branch (Debian bookworm's 535 on a 580 driver) starts, then refuses
its clients or dies with a message in server.log that says nothing of versions. The
binaries carry their version as text ("535.309.01"), NVML says the driver's, so the
daemon can say so before it starts MPS, and what to do about it. `find_control` looks
for the control binary where drivers install it when it is not on PATH (the daemon itself
takes it from PATH: a caller that found it elsewhere puts its folder first there).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import pynvml

MPS_CONTROL = "nvidia-cuda-mps-control"
# Where driver packages and GPU images put it (the first GPU host: /usr/local/nvidia/bin).
DRIVER_DIRS = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/sbin", "/usr/local/bin")
# A driver version as NVIDIA writes it: branch.minor.patch ("535.309.01", "580.159.03").
VERSION = re.compile(rb"(?<![\d.])(\d{3})\.(\d{2,3})\.(\d{2})(?![\d.])")


def driver_version() -> str | None:
    """The running driver's version per NVML ("580.159.03"); None without a driver."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    finally:
        pynvml.nvmlShutdown()


def binary_versions(binary: Path) -> set[str]:
    """The driver versions written in a binary (one for NVIDIA's MPS binaries)."""
    return {m.group(0).decode() for m in VERSION.finditer(binary.read_bytes())}


def branch_mismatch(binary: str, driver: str | None) -> str:
    """Why the MPS control binary `binary` (a name on PATH or a path) cannot serve the
    driver `driver`; "" when its branch matches, or when either version is unknown."""
    path = shutil.which(binary)
    if path is None or driver is None:
        return ""
    found = binary_versions(Path(path))
    branch = driver.split(".")[0]
    if not found or any(v.split(".")[0] == branch for v in found):
        return ""
    return (
        f"{path} is from driver {', '.join(sorted(found))}, the driver is {driver}: MPS "
        "servers of another driver branch refuse their clients; put the "
        f"nvidia-cuda-mps-control and nvidia-cuda-mps-server of driver {driver} (installed "
        "with it) first on PATH, or set mps: off"
    )


def find_control(extra: Sequence[Path] = ()) -> Path | None:
    """nvidia-cuda-mps-control: on PATH, else in the drivers' folders, else in `extra`."""
    found = shutil.which(MPS_CONTROL)
    if found:
        return Path(found)
    hits = (Path(d) / MPS_CONTROL for d in (*DRIVER_DIRS, *map(str, extra)))
    return next((p for p in hits if os.access(p, os.X_OK)), None)


def path_with(control: Path) -> str:
    """PATH with the control binary's folder (and the server's, beside it) first."""
    here = [str(control.parent), str(control.parent.parent / "sbin")]
    return os.pathsep.join([*here, os.environ.get("PATH", "")])
