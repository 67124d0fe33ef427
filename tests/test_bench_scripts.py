"""`tokenrouterd bench engines` end to end at a tiny size: it runs and reports sanely.

This checks the script (calibration, engine group, reference loop, JSON), it times
nothing: the numbers of a run this small mean nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from background import Finished

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def bench_routing(work: Path) -> tuple[list[str], dict[str, str]]:
    args = ["--n", "1", "--max-tokens", "24", "--tau", "0.8", "--ref-requests", "1"]
    args += ["--out", str(work / "routing.json")]
    return [sys.executable, "-m", "trd.daemon", "bench", "engines", *args], {}


# Run from the fixture models' build on, beside the other tests (tests/background.py).
@pytest.mark.background.with_args(bench_routing, after_models=True)
def test_bench_routing_reports_every_row(tiny_models: dict[str, Path], finished: Finished) -> None:
    out = finished.work / "routing.json"
    assert finished.returncode == 0, finished.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(r["n"], r["max_tokens"]) for r in result["runs"]] == [(1, 24)]
    assert result["taus"] == {"24": 0.8} and result["kind"] == "bench engines"
    for row in result["runs"]:
        assert row["tokens"] == 8 * 24  # max(8, 2 * N) requests, ignore_eos
        assert 0.0 < row["large_fraction"] < 1.0
        assert row["handoffs_per_request"] > 0 and row["handoff_us_p50"] > 0
        assert row["tok_s"] > 0 and row["reference_tok_s"] > 0
    assert "speedup" in finished.stdout and f"wrote {out}" in finished.stdout


@pytest.mark.slow  # per commit: test_share_control's first move in force
def test_share_run_samples_the_control_loop(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """The real-pair share run's script on the fixtures, briefly: it serves, samples the
    admin API and writes them (convergence itself: test_share_control)."""
    out = tmp_path / "share.json"
    args = ["--pair", "tiny", "--target", "0.3", "--seconds", "20", "--start-threshold", "0.3"]
    args += ["--out", str(out)]  # tau 0.3: almost every token large; the target needs ~0.85
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / "share_run.py"), *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["errors"] == 0 and result["target"] == 0.3
    samples = result["samples"]
    totals = [s["total"] for s in samples]  # the first may be 0 on a loaded machine
    assert len(samples) >= 5 and totals == sorted(totals) and totals[-1] > 0, totals
    assert samples[-1]["moves"] > 0 and samples[-1]["threshold"] > 0.5
    assert f"wrote {out}" in run.stdout
