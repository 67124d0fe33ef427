"""The code base stays ruff-clean (lint and format) and mypy-clean (the package, tests and
scripts); part of the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from background import Finished

ROOT = Path(__file__).resolve().parent.parent


def ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True
    )


def test_ruff_check_is_clean() -> None:
    result = ruff("check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = ruff("format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def mypy(work: Path) -> tuple[list[str], dict[str, str]]:
    return [sys.executable, "-m", "mypy", "trd", "tests", "scripts"], {}


@pytest.mark.background.with_args(mypy)
def test_mypy_is_clean(finished: Finished) -> None:
    """The package, its tests and the scripts (run from collection on: tests/background.py)."""
    assert finished.returncode == 0, finished.stdout + finished.stderr
