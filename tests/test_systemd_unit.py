"""The systemd unit: systemd-analyze accepts it, and its stop timing matches the drain."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trd.daemon import EXIT_CONFIG

SYSTEMD = Path(__file__).resolve().parent.parent / "systemd"
UNIT = SYSTEMD / "tokenrouterd.service"
# What an engine group's close() may take after the drain (SIGTERM, then SIGKILL).
ENGINE_STOP_S = 5


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    # verify checks that ExecStart's binary exists; point it at this interpreter.
    text = UNIT.read_text()
    exec_start = unit_settings()["ExecStart"][0]
    unit = tmp_path / "tokenrouterd.service"
    unit.write_text(text.replace(exec_start.split()[0], f"{sys.executable} -m trd.daemon"))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    # Unknown keys and unparsable values are only warnings; they name the file.
    problems = [line for line in done.stderr.splitlines() if unit.name in line]
    assert done.returncode == 0 and not problems, done.stderr


def test_unit_is_notify_type_and_outlasts_the_drain() -> None:
    s = unit_settings()
    assert s["Type"] == ["notify"]
    assert s["Restart"] == ["on-failure"]
    assert s["RestartPreventExitStatus"] == [str(EXIT_CONFIG)]
    assert s["KillMode"] == ["mixed"]  # SIGTERM to the supervisor, which stops its engines
    assert s["ExecStart"][0].endswith("--config /etc/tokenrouter/config.yaml")
    grace = yaml.safe_load((SYSTEMD / "config.example.yaml").read_text())["shutdown"]["grace_s"]
    assert int(s["TimeoutStopSec"][0]) >= grace + ENGINE_STOP_S


def test_sandbox_keeps_shared_memory_and_gpu_nodes() -> None:
    s = unit_settings()
    assert s.get("PrivateDevices", ["no"]) == ["no"]
    assert "PrivateIPC" not in s
    assert s["ProtectSystem"] == ["strict"]  # /dev (with /dev/shm) is outside its reach
    assert "InaccessiblePaths" not in s


def test_flashinfer_compiles_into_the_units_cache_directory() -> None:
    """flashinfer's JIT cache defaults to the home directory, read-only in the sandbox."""
    s = unit_settings()
    env = dict(e.split("=", 1) for e in s["Environment"])
    assert env["FLASHINFER_WORKSPACE_BASE"] == f"/var/cache/{s['CacheDirectory'][0]}"
