"""Decide from the `mps:` setting and the host whether to run the MPS control daemon."""

from __future__ import annotations

import logging
from typing import Literal

from trd.devices import GpuInfo
from trd.mps.manager import MPS_CONTROL, MpsError

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "install the MPS binaries of the driver's branch (they come with NVIDIA's driver; "
    "Debian's nvidia-cuda-mps from non-free matches Debian's driver), or set mps: off"
)


def resolve_mps(
    mode: Literal["auto", "required", "off"], gpus: list[GpuInfo], binary: str | None
) -> tuple[bool, str]:
    """Whether to start MPS, and if not why; `binary` is the control binary's path or None.

    `auto` quietly falls back (one info line) when the GPU or the binary is
    missing; `required` raises MpsError naming what is missing.
    """
    if mode == "off":
        return False, "mps: off"
    missing = []
    if not gpus:
        missing.append("no GPU found by NVML")
    if binary is None:
        missing.append(f"{MPS_CONTROL} is not on PATH ({INSTALL_HINT})")
    if not missing:
        return True, ""
    reason = "; ".join(missing)
    if mode == "required":
        raise MpsError(f"mps: required, but {reason}")
    log.info("MPS not used (mps: auto): %s", reason)
    return False, reason
