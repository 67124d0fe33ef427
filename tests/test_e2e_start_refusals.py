"""Starts the daemon refuses, through the real `tokenrouterd` process and its `--check`:
exit status 2 (the unit's RestartPreventExitStatus: restarting cannot help), the whole
reason on stderr, and nothing started: no engine process, no shared-memory segment.

A memory plan that does not fit prints its whole table (e7803bb: the stderr tap cut the
message after its first line); `mps: required` on a host without MPS names what is
missing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from daemon_fixture import REPO_ROOT, shm_segments, write_config
from proc_tree import children

MODES = {"serve": (), "--check": ("--check",)}


def refused(config: Path, mode: str) -> list[str]:
    """The stderr lines of a daemon start that must exit 2 at once."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trd.daemon", "--config", str(config), *MODES[mode]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
    )  # fmt: skip
    out, err = proc.communicate(timeout=300)  # seconds on a quiet machine
    assert proc.returncode == 2, (out, err)
    assert children(proc.pid) == [] and shm_segments(proc.pid) == []
    return err.splitlines()


@pytest.mark.parametrize("mode", MODES)
def test_a_plan_that_does_not_fit_exits_2_with_its_whole_table(
    tmp_path: Path, tiny_models: dict[str, Path], mode: str
) -> None:
    config = write_config(tmp_path, tiny_models, ["small", "large"], memory={"budget_gib": 1e-4})
    lines = refused(config, mode)
    start = lines.index("tokenrouterd: the models do not fit in memory:")
    header, small, large, total, fix = lines[start + 1 : start + 6]
    assert header.split()[:2] == ["model", "device"] and header.endswith("needed GiB"), header
    assert small.split()[:2] == ["small", "cpu"] and large.split()[:2] == ["large", "cpu"]
    assert total.startswith("cpu: needs at least ") and "budget is 0.00 GiB" in total, total
    assert fix.startswith("to fix: lower max_model_len"), fix


@pytest.mark.parametrize("mode", MODES)
def test_mps_required_without_mps_exits_2_naming_what_is_missing(
    tmp_path: Path, tiny_models: dict[str, Path], mode: str
) -> None:
    config = write_config(tmp_path, tiny_models, ["small"], device="auto", mps="required")
    lines = refused(config, mode)
    assert lines[-1].startswith("tokenrouterd: mps: required, but no GPU found by NVML"), lines


def test_a_checkpoint_that_cannot_be_read_exits_2_naming_the_model(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    """An OSError reading the weights (here a folder where the file should be; in the
    unit's sandbox, a file the service user may not read) is the model's config error,
    not a traceback."""
    broken = tmp_path / "broken"
    shutil.copytree(tiny_models["small"], broken)
    (broken / "model.safetensors").unlink()
    (broken / "model.safetensors").mkdir()
    lines = refused(write_config(tmp_path, {"small": broken}, ["small"]), "--check")
    assert lines[-1].startswith("tokenrouterd: models[0].path: "), lines
    assert lines[-1].endswith("model.safetensors: cannot read it (Is a directory)"), lines
