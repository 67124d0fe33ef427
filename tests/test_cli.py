"""trctl without a daemon: argument parsing, table rendering, unreachable admin API."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from trd import version
from trd.cli import AdminError, format_status, format_thresholds, main, parse_settings, request

STATUS: dict[str, Any] = {
    "state": "serving", "reason": "", "pid": 42, "uptime_s": 3725.0, "restarts": 1,
    "model": "small+large", "active_requests": 3, "max_inflight": 256,
    "policy": {"name": "rstitch", "threshold": 0.5}, "handoffs_per_s": 12.34,
    "memory": {"rss_bytes": 451 << 20},
    "mps": {"state": "running", "reason": "", "pid": 77, "pipe_dir": "/run/trd/mps/pipe"},
    "engines": [
        {"model": 0, "name": "small", "pid": 43, "device": "cpu", "dtype": "float32",
         "state": "ready", "kv_pages_used": 10, "kv_pages_free": 246, "running": 2,
         "waiting": 0, "pending": 1, "tokens_per_s": 80.0, "handoffs_per_s": 12.34,
         "batch_size_mean": 1.5, "thresholds": [1], "memory": {"rss_bytes": 1462 << 20},
         "prefix_cache": {"cached_pages": 7, "hit_rate": 0.625, "evictions": 3},
         "quantization": "int4", "weight_bytes": 2**29,
         "crossover": {"896x4bit": None, "4864x8bit": 1024}},
        {"model": 1, "name": "large", "pid": None, "device": "cpu", "dtype": "float32",
         "state": "down", "kv_pages_used": None, "kv_pages_free": None, "running": None,
         "waiting": None, "pending": None, "tokens_per_s": None, "handoffs_per_s": None,
         "batch_size_mean": None, "thresholds": None},
    ],
    "thresholds": {"max_wait_ms": 20.0, "models": {}},
    "memory_plan_table": "model  device\nsmall  cpu",
}  # fmt: skip
PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_status_table_shows_engines_rates_and_plan() -> None:
    text = format_status(STATUS)
    lines = text.splitlines()
    assert lines[0].startswith("tokenrouterd pid 42: serving, model small+large, up 1h02m05s")
    assert lines[1] == (
        "policy rstitch threshold=0.5; active requests 3/256; handoffs 12.3/s; resident 451 MiB"
    )
    assert lines[2] == "MPS: running, control daemon pid 77, pipe /run/trd/mps/pipe"
    small = next(line for line in lines if line.startswith("0 "))
    assert small.split() == ["0", "small", "local", "43", "cpu", "float32", "int4", "0.50G",
                             "ready", "10", "246", "7", "62%", "3", "2", "0", "1", "80.0", "12.3",
                             "1.5", "1,462", "[1]"]  # fmt: skip
    assert "small: quantised linears run dense from rows: 896x4bit: never, 4864x8bit: 1024" in lines
    large = next(line for line in lines if line.startswith("1 "))
    assert large.split()[3] == "-" and "down" in large and large.split()[-2] == "-"
    off = {**STATUS["engines"][0], "prefix_cache": None}  # engine.prefix_cache: false
    row = next(r for r in format_status({**STATUS, "engines": [off]}).splitlines() if r[:2] == "0 ")
    assert row.split()[11:14] == ["off", "-", "-"]
    assert text.endswith("memory plan:\nmodel  device\nsmall  cpu")


def test_mps_off_says_why() -> None:
    off = {**STATUS, "mps": {"state": "off", "reason": "no GPU found by NVML", "pid": None,
                             "pipe_dir": ""}}  # fmt: skip
    assert format_status(off).splitlines()[2] == "MPS: off (no GPU found by NVML)"


def test_thresholds_table() -> None:
    view = {"max_wait_ms": 5.0, "models": {"large": {"set": [1, 2], "engine": [1, 2]}}}
    assert format_thresholds(view).splitlines()[1].split() == ["large", "[1,", "2]", "[1,", "2]"]


def test_parse_settings() -> None:
    assert parse_settings(["small=1", "large=1,2,4"]) == {"small": [1], "large": [1, 2, 4]}
    for bad in ("small", "=1", "large=1,x", "large=0", "large="):
        with pytest.raises(AdminError, match="MODEL=B"):
            parse_settings([bad])


def test_unreachable_admin_api_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(AdminError, match="cannot reach the admin API"):
        request(f"unix:{tmp_path}/none.sock", "GET", "/status")
    with pytest.raises(AdminError, match="not host:port"):
        request("localhost", "GET", "/status")
    assert main(["--admin", f"unix:{tmp_path}/none.sock", "status"]) == 1
    assert "trctl: cannot reach the admin API" in capsys.readouterr().err


def test_both_commands_print_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from trd.daemon import parse_args as daemon_args

    for parse, prog in ((main, "trctl"), (daemon_args, "tokenrouterd")):
        with pytest.raises(SystemExit) as done:
            parse(["--version"])
        assert done.value.code == 0
        assert capsys.readouterr().out == f"{prog} {version()}\n"
    assert version() == tomllib.loads(PYPROJECT.read_text())["project"]["version"]


def test_a_checkout_run_without_installing_still_knows_its_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GPU check runs the daemon from the checkout (PYTHONPATH, no install): the first
    device run found the daemon failing to start there: building its `--version` text raised
    PackageNotFoundError."""
    from importlib.metadata import PackageNotFoundError

    import trd

    def not_installed(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(trd, "_version", not_installed)
    assert version() == tomllib.loads(PYPROJECT.read_text())["project"]["version"]
