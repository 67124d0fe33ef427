"""`tokenrouterd eval demo` on the fixture pair (the demo pair's run is the lead's: its
minutes): every system answers every question, the routed answers' shares are their
producers', and the markdown report is made from the result file's numbers."""

from __future__ import annotations

import json
from pathlib import Path

from trd.evals import demo


def test_the_report_is_the_results(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    out, md = tmp_path / "demo.json", tmp_path / "demo.md"
    argv = ["--small", str(tiny_models["small"]), "--large", str(tiny_models["large"]),
            "--tau", "0.8", "--out", str(out), "--markdown", str(md)]  # fmt: skip
    assert demo.main(argv) == 0
    body = json.loads(out.read_text())
    runs = {run["system"]: run for run in body["runs"]}
    assert list(runs) == ["small", "large", "routed"]
    for run in runs.values():
        assert [r["question"] for r in run["records"]] == list(demo.QUESTIONS)
    routed = runs["routed"]["records"]
    assert 0 < runs["routed"]["summary"]["large_share"] < 1  # tau 0.8: both models write
    assert any("«" in r["text"] for r in routed) and all(r["tokens"] > 0 for r in routed)
    assert all(runs[n]["summary"]["step_ms_batch16"] > 0 for n in ("small", "large"))
    text = md.read_text()
    first = f"| 1 | {demo.QUESTIONS[0]} | " + " | ".join(
        f"{runs[n]['records'][0]['nll']:.2f}" for n in demo.SYSTEMS)  # fmt: skip
    assert first in text and "tau = 0.800" in text and body["command"][0] == "tokenrouterd"
