"""The systemd unit: systemd-analyze accepts it, and its stop timing matches the drain."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trd.daemon import EXIT_CONFIG

SYSTEMD = Path(__file__).resolve().parent.parent / "systemd"
UNIT = SYSTEMD / "tokenrouterd.service"
EXAMPLE = SYSTEMD / "config.example.yaml"
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
    grace = yaml.safe_load(EXAMPLE.read_text())["shutdown"]["grace_s"]
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


def test_api_keys_come_from_a_credential_or_an_optional_environment_file() -> None:
    """Never from the unit's text; the credential's path is the one the example config names."""
    s = unit_settings()
    assert s["EnvironmentFile"] == ["-/etc/tokenrouter/env"]  # "-": none is fine
    assert not any(e.startswith(("TRD_API_KEY", "VLLM_API_KEY")) for e in s["Environment"])
    credential = re.search(r"^#\s+LoadCredential=(\S+):(\S+)$", UNIT.read_text(), re.M)
    assert credential, "the unit documents LoadCredential"
    example = yaml.safe_load(re.sub(r"^# (api_key_file:)", r"\1", EXAMPLE.read_text(), flags=re.M))
    assert example["api_key_file"] == f"/run/credentials/{UNIT.name}/{credential[1]}"


def test_flashinfers_compiler_and_ninja_are_on_the_units_path() -> None:
    """flashinfer compiles kernels at first start: nvcc from CUDA_HOME, `ninja` from PATH,
    which pip installs next to tokenrouterd (ExecStart's directory)."""
    s = unit_settings()
    env = dict(e.split("=", 1) for e in s["Environment"])
    path = env["PATH"].split(":")
    assert f"{env['CUDA_HOME']}/bin" in path
    assert str(Path(s["ExecStart"][0].split()[0]).parent) in path
