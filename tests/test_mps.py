"""The managed MPS control daemon, against Debian's real nvidia-cuda-mps-control.

The control daemon starts, answers and quits without a GPU (only its MPS
servers need one), so these tests run it for real. The package is fetched once
by scripts/fetch_mps.sh into .cache/mps/ without installing anything.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trd.devices import GpuInfo
from trd.mps import manager as manager_mod
from trd.mps.driver import binary_versions, branch_mismatch
from trd.mps.manager import MpsError, MpsManager, daemon_pid, is_running
from trd.mps.resolve import resolve_mps

REPO = Path(__file__).resolve().parents[1]
UUID = "GPU-6f1e04a4-7cd2-0c0d-4bd6-0e4b4d1a7c55"
GPU = GpuInfo(0, "NVIDIA H100 80GB HBM3", 85_520_809_984, 84_000_000_000, UUID)


@pytest.fixture(scope="session")
def mps_binary() -> str:
    script = REPO / "scripts" / "fetch_mps.sh"
    try:
        done = subprocess.run(
            [str(script), str(REPO / ".cache" / "mps")],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("fetching nvidia-cuda-mps timed out")
    if done.returncode != 0:
        pytest.skip(f"cannot fetch nvidia-cuda-mps: {done.stderr.strip()[-500:]}")
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture
def manager(tmp_path: Path, mps_binary: str) -> Iterator[MpsManager]:
    mps = MpsManager(tmp_path, mps_binary, gpu_uuid=UUID)
    yield mps
    mps.stop()


def _start_by_hand(runtime_dir: Path, binary: str) -> int:
    """Start a control daemon the way a crashed earlier tokenrouterd left one running."""
    pipe, log = runtime_dir / "mps" / "pipe", runtime_dir / "mps" / "log"
    pipe.mkdir(parents=True)
    log.mkdir()
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}
    subprocess.run([binary, "-d"], env=env, check=True, timeout=10)
    for _ in range(100):
        pid = daemon_pid(pipe)
        if pid is not None:
            return pid
        time.sleep(0.05)
    raise AssertionError("hand-started daemon never listened")


def test_start_answers_and_stop_cleans_up(manager: MpsManager, tmp_path: Path) -> None:
    manager.start()
    for d in (tmp_path / "mps", tmp_path / "mps" / "pipe", tmp_path / "mps" / "log"):
        assert d.is_dir()
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert (tmp_path / "mps" / "log" / "control.log").is_file()
    pid = daemon_pid(manager.pipe_dir)
    assert pid is not None and is_running(pid)
    assert "nvidia-cuda-mps-control" in Path(f"/proc/{pid}/cmdline").read_text()
    # The GPU goes to the daemon (and so to its servers) by UUID.
    assert f"CUDA_VISIBLE_DEVICES={UUID}" in Path(f"/proc/{pid}/environ").read_text().split("\0")
    # No CUDA client has connected, so the daemon has started no server.
    assert manager.query("get_server_list") == ""
    assert manager.query("get_default_active_thread_percentage").strip() == "100.0"

    manager.stop()
    assert not is_running(pid)
    assert not (tmp_path / "mps").exists()
    manager.stop()  # idempotent


def test_engine_env(tmp_path: Path) -> None:
    mps = MpsManager(tmp_path, gpu_uuid=UUID)
    assert mps.engine_env() == {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps" / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps" / "log"),
    }


def test_stale_daemon_is_replaced(manager: MpsManager, tmp_path: Path, mps_binary: str) -> None:
    stale = _start_by_hand(tmp_path, mps_binary)
    manager.start()
    assert not is_running(stale)
    pid = daemon_pid(manager.pipe_dir)
    assert pid is not None and pid != stale and is_running(pid)
    assert manager.query("get_server_list") == ""


def test_hung_stale_daemon_is_killed(
    manager: MpsManager, tmp_path: Path, mps_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager_mod, "COMMAND_TIMEOUT_S", 0.5)
    monkeypatch.setattr(manager_mod, "QUIT_TIMEOUT_S", 0.5)
    stale = _start_by_hand(tmp_path, mps_binary)
    os.kill(stale, signal.SIGSTOP)  # it can no longer answer `quit`
    manager.start()
    assert not is_running(stale)
    assert daemon_pid(manager.pipe_dir) not in (None, stale)


def test_leftover_socket_of_dead_daemon(
    manager: MpsManager, tmp_path: Path, mps_binary: str
) -> None:
    dead = _start_by_hand(tmp_path, mps_binary)
    os.kill(dead, signal.SIGKILL)
    assert (manager.pipe_dir / "control").exists()
    manager.start()
    assert daemon_pid(manager.pipe_dir) not in (None, dead)


def test_errors_name_command_exit_code_and_output(tmp_path: Path, mps_binary: str) -> None:
    mps = MpsManager(tmp_path, mps_binary)
    mps.pipe_dir.mkdir(parents=True)
    with pytest.raises(MpsError) as info:
        mps.query("get_server_list")
    assert str(info.value) == (
        f"{mps_binary} <<< 'get_server_list': exit code 1: Cannot find MPS control daemon process"
    )


def test_missing_binary_fails_start_and_cleans_up(tmp_path: Path) -> None:
    mps = MpsManager(tmp_path, "/nonexistent/nvidia-cuda-mps-control")
    with pytest.raises(MpsError, match="/nonexistent/nvidia-cuda-mps-control not found"):
        mps.start()
    assert not (tmp_path / "mps").exists()


def test_bad_settings_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(MpsError, match="exceeds 107 bytes"):
        MpsManager(tmp_path / ("x" * 100))


def test_resolve_off_never_uses_mps() -> None:
    assert resolve_mps("off", [GPU], "/usr/bin/nvidia-cuda-mps-control") == (False, "mps: off")


def test_resolve_auto(caplog: pytest.LogCaptureFixture) -> None:
    binary = "/usr/bin/nvidia-cuda-mps-control"
    assert resolve_mps("auto", [GPU], binary) == (True, "")
    with caplog.at_level(logging.INFO, logger="trd.mps.resolve"):
        assert resolve_mps("auto", [], binary) == (False, "no GPU found by NVML")
    assert [r.getMessage() for r in caplog.records] == [
        "MPS not used (mps: auto): no GPU found by NVML"
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trd.mps.resolve"):
        assert resolve_mps("auto", [GPU], None)[0] is False
    (record,) = caplog.records
    assert "nvidia-cuda-mps-control is not on PATH" in record.getMessage()


def test_resolve_required() -> None:
    assert resolve_mps("required", [GPU], "/usr/bin/nvidia-cuda-mps-control") == (True, "")
    with pytest.raises(MpsError) as info:
        resolve_mps("required", [], None)
    assert str(info.value) == (
        "mps: required, but no GPU found by NVML; nvidia-cuda-mps-control is not on PATH "
        "(install the MPS binaries of the driver's branch (they come with NVIDIA's driver; "
        "Debian's nvidia-cuda-mps from non-free matches Debian's driver), or set mps: off)"
    )
    with pytest.raises(MpsError, match=r"^mps: required, but no GPU found by NVML$"):
        resolve_mps("required", [], "/usr/bin/nvidia-cuda-mps-control")


def _binary(tmp_path: Path, version: str) -> str:
    """An executable that carries `version` the way NVIDIA's MPS binaries do (as text)."""
    path = tmp_path / "bin" / "nvidia-cuda-mps-control"
    path.parent.mkdir()
    path.write_text(f"#!/bin/sh\n# NVIDIA MPS control {version}\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def test_an_mps_binary_of_another_driver_branch_is_named_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian bookworm's 535 binaries on the 580 driver of a cloud image."""
    binary = _binary(tmp_path, "535.309.01")
    monkeypatch.setattr(manager_mod, "driver_version", lambda: "580.159.03")
    with pytest.raises(MpsError) as info:
        MpsManager(tmp_path, binary).start()
    assert str(info.value) == (
        f"{binary} is from driver 535.309.01, the driver is 580.159.03: MPS servers of "
        "another driver branch refuse their clients; put the nvidia-cuda-mps-control and "
        "nvidia-cuda-mps-server of driver 580.159.03 (installed with it) first on PATH, "
        "or set mps: off"
    )
    assert branch_mismatch(binary, "535.104.05") == ""  # same branch
    assert branch_mismatch(binary, None) == ""  # no driver: the start itself will say


def test_the_debian_binary_carries_its_version(mps_binary: str) -> None:
    assert {v.split(".")[0] for v in binary_versions(Path(mps_binary))} == {"535"}
