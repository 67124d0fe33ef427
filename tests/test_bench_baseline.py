"""`bench compare --plan baseline` (trd/bench/compare/baseline.py): its table, its systems'
settings, one system measured for a request per commit, and a run of its smoke size on the
fixture pair (slow tier: two daemons started one after another, about 120 s)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from trd.bench import datasets
from trd.bench.compare.baseline import (
    BASELINES,
    LLAMA,
    BaselinePlan,
    UnknownSystem,
    names_of,
    pick,
    run_system,
    systems,
    table,
)
from trd.bench.compare.cli import main
from trd.demo.pair import RSTITCH_TAU, SPECULATE

CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache"


def summary(tok_s: float, large: float | None, failed: int = 0) -> dict[str, object]:
    ms = {"mean": 1.0, "p50": 1500.0, "p90": 2.0, "p99": 3.0}
    return {"output_throughput": tok_s, "ttft_ms": ms, "tpot_ms": ms, "e2el_ms": ms,
            "large_share": large, "requests": 2, "failed": failed}  # fmt: skip


def test_the_table_says_which_answers_kept_their_text_across_n() -> None:
    recs = [{"prompt": "p1", "text": "a"}, {"prompt": "p2", "text": "b"}]
    changed = [{"prompt": "p1", "text": "a"}, {"prompt": "p2", "text": "c"}]
    runs = [
        {"system": "tokenrouterd", "n": 1, "summary": summary(3.5, 0.25), "records": recs},
        {"system": "tokenrouterd", "n": 16, "summary": summary(9.0, 0.25), "records": changed},
        {"system": "llama_server_small", "n": 1, "summary": summary(5.0, None), "records": recs},
    ]
    lines = table(runs)
    assert lines[2] == "| tokenrouterd | 1 | 3.50 | 1500 | 1500.0 | 1.5 | 25.0 | 2/2 | 0 |"
    assert lines[3].startswith("| tokenrouterd | 16 | 9.00 |") and "| 1/2 |" in lines[3]
    assert lines[4].endswith("| 1.5 | - | 2/2 | 0 |")  # no producers: no large share


def test_the_baseline_plan_is_the_issues_table() -> None:
    plan = BASELINES["baseline"]
    assert (plan.ns, plan.prompts, plan.max_tokens, plan.llama) == ((1, 16), 16, 256, True)
    assert (plan.routed, plan.alone, plan.shares, plan.rstitch) == (
        ("int8,int4", "int4", "int8"), ("int4",), (0.3,), True)  # fmt: skip
    assert LLAMA == {"llama_server_large": ("large", None), "llama_server_small": ("small", None),
                     "llama_server_large+draft_small": ("large", "small")}  # fmt: skip
    demo = "tokenrouterd_int8+int4"
    assert names_of(plan) == [*LLAMA, demo, f"{demo}@rstitch", f"{demo}@share0.3",
                              "tokenrouterd_int4", "std_large_int4",
                              "tokenrouterd_int8"]  # fmt: skip


def test_systems_picks_the_named_ones_in_the_plans_order_and_refuses_others(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = BASELINES["baseline"]
    assert pick(plan, None) == names_of(plan)
    assert pick(plan, ["tokenrouterd_int4", "llama_server_large"]) == [
        "llama_server_large", "tokenrouterd_int4"]  # fmt: skip
    with pytest.raises(UnknownSystem, match="--systems: std_large_int8 not in this plan; it has "
                       "llama_server_large, "):  # fmt: skip
        pick(plan, ["std_large_int8"])
    for argv, says in (
        (["--plan", "baseline", "--systems", "llama_server_tiny"], "llama_server_tiny not in"),
        (["--plan", "smoke", "--systems", "tokenrouterd_int4"], "only the baseline plans"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and says in capsys.readouterr().err


def test_one_system_is_measured_at_each_n_of_its_plan(
    tiny_models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slow smoke run's guard: the systems are alike but for their models, and one of
    them (the large model alone, the quicker start) is started and measured, warm-up aside."""
    assert list(systems(BASELINES["baseline_smoke"], "tiny", CACHE_DIR, ["tokenrouterd_int8"]))\
        == ["tokenrouterd_int8"]  # fmt: skip
    found = systems(BASELINES["baseline_smoke"], "tiny", CACHE_DIR)
    assert list(found) == ["tokenrouterd_none", "std_large_none", "tokenrouterd_int8"]
    (ours, _), (std, start) = found["tokenrouterd_none"], found["std_large_none"]
    assert [m["name"] for m in std["models"]] == ["large"] and len(ours["models"]) == 2
    assert {k: v for k, v in std.items() if k not in ("models", "policy")} == {
        k: v for k, v in ours.items() if k not in ("models", "policy")
    }
    mixed = BaselinePlan(ns=(1,), prompts=1, max_tokens=4, llama=False, routed=("none,int8",),
                         alone=())  # fmt: skip
    ((pair_cfg, _),) = systems(mixed, "tiny", CACHE_DIR).values()  # each model its own mode
    assert [m.get("quantization") for m in pair_cfg["models"]] == ["none", "int8"]
    assert names_of(mixed) == ["tokenrouterd_none+int8"]
    alone8 = BaselinePlan(ns=(1,), prompts=1, max_tokens=4, llama=False, routed=(),
                          alone=("int8",))  # fmt: skip
    ((std8, _),) = systems(alone8, "tiny", CACHE_DIR).values()  # quantised alone too
    assert [m.get("quantization") for m in std8["models"]] == ["int8"]
    shared = BaselinePlan(ns=(1,), prompts=1, max_tokens=4, llama=False, routed=("none",),
                          alone=(), shares=(0.5,))  # fmt: skip
    found = systems(shared, "tiny", CACHE_DIR)
    assert list(found) == ["tokenrouterd_none", "tokenrouterd_none@share0.5"]
    policies = [cfg["policy"] for cfg, _ in found.values()]
    assert [p.get("request_large_share") for p in policies] == [None, 0.5]
    assert {p["threshold"] for p in policies} == {RSTITCH_TAU["tiny"]}
    # Where the pair speculates (the qwen demo): its default drafts, @rstitch routes
    drafting = BaselinePlan(ns=(1,), prompts=1, max_tokens=4, llama=False, routed=("none",),
                            alone=(), rstitch=True)  # fmt: skip
    monkeypatch.setitem(SPECULATE, "tiny", True)
    found = systems(drafting, "tiny", CACHE_DIR)
    assert list(found) == ["tokenrouterd_none", "tokenrouterd_none@rstitch"]
    for (cfg, _), pinned in zip(found.values(), ("large", None), strict=True):
        assert [m.get("draft") for m in cfg["models"]] == [None, "small"]
        assert cfg["policy"].get("request_model") == pinned
    plan = BaselinePlan(ns=(1,), prompts=1, max_tokens=4, llama=False, routed=(), alone=("none",))
    server = start(tmp_path)
    try:
        runs = asyncio.run(run_system("std_large_none", server.url, plan, datasets.load(
            "code", 1, 0, endpoint="chat")))  # fmt: skip
    finally:
        server.stop()
    got = [(r["n"], r["summary"]["requests"], r["summary"]["output_tokens"],
            r["summary"]["failed"]) for r in runs]  # fmt: skip
    assert got == [(1, 1, 4, 0)]


@pytest.mark.slow
def test_a_baseline_smoke_run_measures_each_system_in_turn(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "baseline.json"
    argv = ["--plan", "baseline_smoke", "--pair", "tiny", "--cache-dir", str(CACHE_DIR),
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    names = ["tokenrouterd_none", "std_large_none", "tokenrouterd_int8"]
    assert result["kind"] == "bench compare" and list(result["systems"]) == names
    got = [(r["system"], r["n"], r["summary"]["requests"], r["summary"]["output_tokens"],
            r["summary"]["failed"]) for r in result["runs"]]  # fmt: skip
    assert got == [(s, n, 2, 16, 0) for s in names for n in (1, 2)]
    assert [r["settings"]["dataset"] for r in result["runs"]] == ["code"] * 6
    ours, std, quant = (result["systems"][n] for n in names)
    assert [m["name"] for m in std["models"]] == ["large"] and len(ours["models"]) == 2
    assert [m.get("quantization") for m in quant["models"]] == ["int8", "int8"]
    assert all("quantization" not in m for m in ours["models"] + std["models"])
    assert {k: v for k, v in std.items() if k not in ("models", "policy")} == {
        k: v for k, v in ours.items() if k not in ("models", "policy")
    }  # like for like: every other setting the same
