"""Device discovery: NVML probing (with and without a driver) and /proc/meminfo."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from trd.devices import GpuInfo, available_ram_bytes, probe_gpus


def test_no_nvml_means_cpu_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    assert probe_gpus() == []


def test_probe_reads_every_gpu_and_shuts_nvml_down(monkeypatch: pytest.MonkeyPatch) -> None:
    memory = {0: (80, 70), 1: (40, 10)}
    names: dict[int, str | bytes] = {0: "NVIDIA H100", 1: b"NVIDIA A100"}
    calls: list[str] = []
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: calls.append("init"))
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    monkeypatch.setattr(
        pynvml,
        "nvmlDeviceGetMemoryInfo",
        lambda i: SimpleNamespace(total=memory[i][0], free=memory[i][1]),
    )
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda i: names[i])
    uuids: dict[int, str | bytes] = {0: "GPU-aaaa", 1: b"GPU-bbbb"}
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUUID", lambda i: uuids[i])
    assert probe_gpus() == [
        GpuInfo(0, "NVIDIA H100", 80, 70, "GPU-aaaa"),
        GpuInfo(1, "NVIDIA A100", 40, 10, "GPU-bbbb"),
    ]
    assert calls == ["init", "shutdown"]


def test_available_ram_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000 kB\nMemFree:  100 kB\nMemAvailable:    2500 kB\n")
    assert available_ram_bytes(meminfo) == 2_560_000
    meminfo.write_text("MemTotal:       16000 kB\n")
    with pytest.raises(ValueError, match="no MemAvailable line"):
        available_ram_bytes(meminfo)
