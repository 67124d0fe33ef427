"""`tokenrouterd bench compare --plan gpu`: its dry run (every stage's code on the CPU at
tiny shapes, run from the fixture models' build on: tests/background.py) and the pieces
its verdicts rest on. The numbers of the dry run mean nothing; what it checks is that
every stage runs, every system writes the designed tokens and the result is complete."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from trd.bench.gpu.bounds import predicted_round_ms
from trd.bench.gpu.plan import PLANS
from trd.bench.gpu.run import stage_order
from trd.bench.gpu.workload import Designed, owners
from trd.bench.identity import digest_ids
from trd.bench.record import Record
from trd.testing.shaped import expected_tokens

from background import Finished

SYSTEMS = {"tokenrouterd", "large_alone", "official", "hf_generate"}


def dry_run(work: Path) -> tuple[list[str], dict[str, str]]:
    out = work / "result.json"
    argv = ["-m", "trd.daemon", "bench", "compare", "--plan", "gpu", "--dry-run", "--out"]
    return [sys.executable, *argv, str(out)], {}


@pytest.mark.slow  # 3-5 minutes of both cores; per commit: the two tests below
@pytest.mark.background.with_args(dry_run, after_models=True)
def test_the_dry_run_passes_every_stage_with_every_system_as_designed(
    tiny_models: dict[str, Path], finished: Finished
) -> None:
    summary = (finished.work / "summary.txt").read_text()
    assert finished.returncode == 0, summary + finished.stderr[-3000:]
    order = stage_order(PLANS["gpu_dry"])
    assert summary.splitlines()[0] == f"PASS: all {len(order)} stages"
    result = json.loads((finished.work / "result.json").read_text())
    assert result["schema"] == "tokenrouterd-result/1" and result["kind"] == "bench compare"
    assert result["plan_name"] == "gpu_dry" and list(result["stages"]) == order
    assert set(result["systems"]) == SYSTEMS
    runs = result["runs"]
    assert {r["system"] for r in runs} == SYSTEMS
    for run in runs:  # every request of every system: the designed ids and models
        assert Designed.identical(run), (run["system"], run["workload"], run["identity"])
    assert {(r["system"], r["n"]) for r in runs} >= {("tokenrouterd", 1), ("tokenrouterd", 2)}
    costs = result["step_costs"]
    assert [b for b, _ in costs["large"]["decode_ms"]] == [1, 2]
    assert all(f > 0 for _, f in costs["small"]["hbm_fraction"])
    targets = {t["name"]: t for t in result["targets"]}
    assert len(targets) == 6
    for name, row in targets.items():  # each computed from the run, none "not run"
        assert row["measured"] != "not run", (name, row)
    assert targets["every request as designed, every system"]["verdict"] == "met"
    assert targets["each policy: graphs on = off, as designed"]["verdict"] == "met"
    policies = {p["policy"]: p for p in result["policies"]}
    assert set(policies) == set(PLANS["gpu_dry"].policies)
    assert all(p["equal"] and p["as_designed"] and p["handoffs"] > 0 for p in policies.values())
    assert "| tokenrouterd | share30 | 2 |" in (finished.work / "table.md").read_text()


def test_the_step_cost_prediction_weights_each_engine_by_its_share() -> None:
    costs = {"small": {"decode_ms": [[1, 2.0], [2, 3.0]]},
             "large": {"decode_ms": [[1, 10.0], [2, 12.0]]}}  # fmt: skip
    assert predicted_round_ms(costs, 1, 0.25) == pytest.approx(0.75 * 2 + 0.25 * 10)
    assert predicted_round_ms(costs, 1, None) == 10.0  # the large model alone
    # N=2: both small (0.81), one each (0.18: 2 + 10), both large (0.01)
    assert predicted_round_ms(costs, 2, 0.1) == pytest.approx(0.81 * 3 + 0.18 * 12 + 0.01 * 12)


def test_the_designed_tokens_catch_a_wrong_token_or_model() -> None:
    prompt, n = list(range(5, 21)), 40
    who = owners(prompt, n, 0.3, seed=7)
    assert 0 < sum(who) < n and owners(prompt, n, 0.3, seed=7) == who
    designed = Designed([prompt], n, 0.3, seed=7)
    tokens = expected_tokens(prompt, n, who)
    names = [("small", "large")[m] for m in who]

    def check(ids: list[int], models: list[str]) -> dict[str, Any]:
        rec = Record(0, 0, digest_ids(prompt), 0.0, output_tokens=n, counted_by="token_ids",
                     token_ids=ids, models=models, prompt_ids=prompt)  # fmt: skip
        run = {"system": "s", "workload": "w", "n": 1, "max_tokens": n, "records": [rec.to_dict()]}
        designed.check(run, [rec])
        return run

    assert Designed.identical(check(tokens, names))
    assert not Designed.identical(check([*tokens[:-1], tokens[-1] + 1], names))
    flipped = ["large" if m == "small" else "small" for m in names[:1]] + names[1:]
    assert not Designed.identical(check(tokens, flipped))
