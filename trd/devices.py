"""Device discovery: the GPUs NVML sees (none means CPU mode) and free host RAM."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pynvml

log = logging.getLogger(__name__)

MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it at probe time."""

    index: int  # NVML's index: PCI bus order
    name: str
    total_bytes: int
    free_bytes: int
    uuid: str = ""  # "GPU-...": how engines and MPS are given the device (no ordering doubt)


def probe_gpus() -> list[GpuInfo]:
    """List the GPUs NVML sees; [] when NVML cannot start (no driver or library)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        # A host without the NVIDIA driver is a normal CPU-mode host, not an error.
        log.debug("NVML unavailable (%s): CPU mode", exc)
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            # Older nvidia-ml-py releases return bytes here.
            if isinstance(name, bytes):
                name = name.decode()
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            gpus.append(GpuInfo(index, name, int(mem.total), int(mem.free), uuid))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def available_ram_bytes(meminfo: Path = MEMINFO) -> int:
    """MemAvailable from /proc/meminfo: RAM usable without swapping, in bytes."""
    for line in meminfo.read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "MemAvailable":
            amount, unit = value.split()
            if unit != "kB":
                raise ValueError(f"{meminfo}: unexpected unit {unit!r} for MemAvailable")
            return int(amount) * 1024
    raise ValueError(f"{meminfo}: no MemAvailable line")
