"""The routing benchmark script end to end at a tiny size: it runs and reports sanely.

This checks the script (calibration, engine group, reference loop, JSON), it times
nothing: the numbers of a run this small mean nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_bench_routing_reports_every_row(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "routing.json"
    args = ["--n", "1", "--max-tokens", "24", "--tau", "0.8", "--ref-requests", "1"]
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_routing.py"), *args, "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(r["n"], r["max_tokens"]) for r in result["rows"]] == [(1, 24)]
    assert result["taus"] == {"24": 0.8}
    for row in result["rows"]:
        assert row["tokens"] == 8 * 24  # max(8, 2 * N) requests, ignore_eos
        assert 0.0 < row["large_fraction"] < 1.0
        assert row["handoffs_per_request"] > 0 and row["handoff_us_p50"] > 0
        assert row["tok_s"] > 0 and row["reference_tok_s"] > 0
    assert "speedup" in run.stdout and f"wrote {out}" in run.stdout
