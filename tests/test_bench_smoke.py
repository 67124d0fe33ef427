"""The benchmark kit end to end at a tiny size, and checks its numbers cannot flatter us.

One run of `tokenrouterd bench compare --plan smoke --pair tiny` (every system of the plan on the
fixture pair: the official loop as reference, the daemon with its runs and ceilings,
standard serving), then:
- every request of every system was compared with the reference, and the reference
  itself agrees with the oracle (`trd/testing/reference.py`) computed here;
- the engines' counters agree exactly with the producers the API returned (tokens,
  dropped candidates, handoffs), and the ceiling bounds the measured throughput;
- a changed output, a run on other prompts or at another large-token share, a
  throughput above its bound: each turns its target row from met to missed / not
  comparable, with the reason;
- the report is generated from the run: change the run, the text changes.
Timings of a run this small mean nothing; nothing here checks a speed.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from trd.bench.compare import headline
from trd.bench.compare.pairs import load_pair
from trd.bench.compare.plan import PLANS
from trd.bench.compare.plots import series_vs_n
from trd.bench.compare.report import render
from trd.bench.compare.runner import Bench
from trd.bench.compare.stepcost import BATCHES
from trd.bench.compare.targets import FULL, Row, official_on, target_rows
from trd.bench.identity import digest_ids, digest_output, identity
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.testing.reference import ReferenceRouter

import background

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO_ROOT / ".cache"  # the fixtures' cache (tests/conftest.py)
Data = dict[str, Any]


def smoke_run(work: Path) -> tuple[list[str], dict[str, str]]:
    argv = ["--plan", "smoke", "--pair", "tiny", "--cache-dir", str(CACHE_DIR)]
    argv += ["--out", str(work / "smoke.json")]
    return [sys.executable, "-m", "trd.daemon", "bench", "compare", *argv], {
        "PYTHONPATH": str(REPO_ROOT)
    }


# Run from the fixture models' build on, beside the other tests (tests/background.py). The
# slow tier: about 170 s of a core. Per commit, test_bench_workloads checks the plans' jobs
# and the step costs, test_bench_serve the one client, test_bench_baseline one system's run.
pytestmark = [pytest.mark.slow, pytest.mark.background.with_args(smoke_run, after_models=True)]


@pytest.fixture(scope="module")
def result(request: pytest.FixtureRequest, tiny_models: dict[str, Path]) -> Data:
    run = background.finished(request.node, timeout=400)
    assert run.returncode == 0, run.stderr[-4000:]
    data: Data = json.loads((run.work / "smoke.json").read_text())
    return data


def run_of(data: Data, system: str, workload: str, n: int) -> Data:
    key = (system, workload, n)
    found = [r for r in data["runs"] if (r["system"], r["workload"], r["n"]) == key]
    assert len(found) == 1, (system, workload, n)
    return found[0]


def rows_of(data: Data) -> dict[str, Row]:
    top = max(data["plan"]["ns"])
    ident = identity(data["runs"], data["reference"])
    rows = target_rows(data["runs"], ident, top, data["pair"]["name"])
    return {r.name.split(",")[0]: r for r in rows}


def test_every_request_of_every_system_is_compared(result: Data) -> None:
    plan = PLANS["smoke"]
    systems = {r["system"] for r in result["runs"]}
    assert systems == {"official", "tokenrouterd", "no_delayed_batching", "forced_delay", "std"}
    ident = identity(result["runs"], result["reference"])
    served = [r for r in result["runs"] if not r.get("reference")]
    for entry, run in zip(ident, served, strict=True):
        repeats = len(run["throughputs"])
        assert entry["compared"] == run["requests"] * repeats, entry
        assert entry["identical"] == entry["compared"] and entry["no_reference"] == 0, entry
    # The kept run and the other repeat at the largest N were both checked.
    top = run_of(result, "tokenrouterd", "short", max(plan.ns))
    assert len(top["throughputs"]) == plan.repeats == 1 + len(top["other_repeats"])


def test_the_reference_agrees_with_the_oracle(result: Data, tiny_models: dict[str, Path]) -> None:
    """The official loop's outputs (the reference) are recomputed by the oracle: full
    recomputation, no cache, the same policy: same ids and the same producing models."""
    bench = Bench(PLANS["smoke"], load_pair("tiny", CACHE_DIR), result["tau"], Path("."))
    w = bench.workload("long", max(PLANS["smoke"].lengths))
    prompt = bench.prompts(w, 1)[0]
    policy = PolicySpec("rstitch", {"threshold": result["tau"]})
    oracle = ReferenceRouter([tiny_models["small"], tiny_models["large"]], policy, "float32")
    for length in PLANS["smoke"].lengths:
        trace = oracle.run(prompt, SamplingParams(max_tokens=length, ignore_eos=True))
        names = [("small", "large")[m] for m in trace.models]
        assert result["reference"][digest_ids(prompt)][str(length)] == digest_output(
            trace.tokens, names
        )
    assert 0 < result["runs"][0]["large_share"] < 1  # both models write: routing is tested


def test_engine_counters_agree_with_the_producers_served(result: Data) -> None:
    for run in result["runs"]:
        c = run.get("ceiling")
        if c is None:
            continue
        assert c["valid"], c.get("invalid")
        small, large = c["models"]["small"], c["models"]["large"]
        prods = [r["producers"] for r in run["records"]]
        # R-Stitch: each escalation drops the small model's candidate and hands off; the
        # large model keeps every token it makes and hands back after a sure one. A hand
        # back the small model escalates again at once (a bounce) shows no small token.
        up, down = large["handoffs_in"], small["handoffs_in"]
        assert (small["dropped_rows"], large["dropped_rows"]) == (up, 0), run["workload"]
        assert up - down == sum(p.endswith("1") for p in prods)  # ended on the large model
        seen_up = sum(p.startswith("1") + p.count("01") for p in prods)
        seen_down = sum(p.count("10") for p in prods)
        assert up - seen_up == down - seen_down >= 0  # bounces count once each way
        assert c["handoff"]["count"] == up + down == c["handoff"]["sampled"]
        for name, m in c["models"].items():
            digit = str(["small", "large"].index(name))  # producers are indices in pair order
            assert m["rows"] == m["committed"] + m["dropped_rows"], name
            assert m["committed"] == sum(p.count(digit) for p in prods), name
            assert 0 < m["forward_s"] <= run["duration_s"], name  # an engine's forwards fit the run
        assert c["bound"]["kind"] == "parallel"
        assert c["bound_s"] == max(small["forward_s"], large["forward_s"])
        assert 0 < c["fraction"] <= 1 and c["ceiling_throughput"] >= run["output_throughput"]


def test_targets_are_judged_like_for_like(result: Data) -> None:
    top = max(PLANS["smoke"].ns)
    official, full = run_of(result, "official", "short", 1), run_of(result, FULL, "short", top)
    assert official["prompt_set"] == full["prompt_set"]  # the loop ran the same prompts
    rows = rows_of(result)
    assert rows[f"tokenrouterd N={top} / official"].verdict in {"met", "missed"}
    assert rows["every request identical to the reference"].verdict == "met"

    shifted = copy.deepcopy(result)
    run_of(shifted, "official", "short", 1)["large_share"] += 0.03
    row = rows_of(shifted)[f"tokenrouterd N={top} / official"]
    assert row.verdict == "not comparable" and "large-token share" in row.why

    fewer = copy.deepcopy(result)
    run_of(fewer, "official", "short", 1)["prompt_set"] = "other"
    assert "different prompts" in rows_of(fewer)[f"tokenrouterd N={top} / official"].why

    assert rows["tokenrouterd / std"].verdict in {"met", "missed"}
    no_std = {**result, "runs": [r for r in result["runs"] if not r["system"].startswith("std")]}
    row = rows_of(no_std)["tokenrouterd / std"]  # a plan without standard serving (pair_long16)
    assert (row.verdict, row.why) == ("not comparable", "the plan runs no standard serving")


def test_a_changed_output_fails_its_rows(result: Data) -> None:
    top = max(PLANS["smoke"].ns)
    changed = copy.deepcopy(result)
    run = run_of(changed, "tokenrouterd", "short", top)
    run["records"][0]["output"], run["records"][0]["diverges_at"] = "0" * 16, 3
    checked = run["requests"] * len(run["throughputs"])  # every repeat's requests
    rows = rows_of(changed)
    for name in (f"tokenrouterd N={top} / official", "throughput / forward-only ceiling",
                 "no_delayed_batching / tokenrouterd", "throughput / batching bound"):  # fmt: skip
        assert rows[name].verdict == "missed", name
        says = f"1 of {checked} requests differ from the reference, first at token 3"
        assert says in rows[name].why, rows[name].why
    assert rows["every request identical to the reference"].verdict == "missed"

    unreferenced = copy.deepcopy(result)
    unreferenced["reference"].pop(run_of(result, "std", "short", 1)["records"][0]["prompt"])
    assert rows_of(unreferenced)["every request identical to the reference"].verdict == "missed"


def test_a_throughput_above_its_bound_is_not_comparable(result: Data) -> None:
    over = copy.deepcopy(result)
    c = run_of(over, "tokenrouterd", "short", max(PLANS["smoke"].ns))["ceiling"]
    c["fraction"] = 1.3
    row = rows_of(over)["throughput / forward-only ceiling"]
    assert row.verdict == "not comparable" and "above the parallel bound" in row.why
    c["handoff"].update(count=5000, sampled=4096)
    assert "the latest 4096 of 5000 handoffs" in rows_of(over)["median handoff latency"].why


def test_report_is_generated_from_the_run(result: Data, tmp_path: Path) -> None:
    extra = {**result, "plan_name": "pair_long"}  # a further run of the main pair
    md = render(result, tmp_path / "report.md", tiny=result, extras=[extra])
    for row in rows_of(result).values():
        assert row.markdown() in md
    # main + the extra run + tiny, the extra one before the tiny table
    assert md.count("| every request identical to the reference | all |") == 3
    assert md.index("## Plan `pair_long`: pair `tiny`") < md.index("## Second table")
    assert "this plan's largest N is" not in md  # the same N as the main run's
    fewer = {**extra, "plan": {**extra["plan"], "ns": [1]}}
    md3 = render(result, tmp_path / "fewer.md", extras=[fewer])
    assert f"(N={max(result['plan']['ns'])} in the main run); this plan's largest N is 1" in md3
    assert "no GPU" in md and "ran 2 time(s)" in md
    assert "load average" in md and result["machine"]["end"]["load"]  # the result schema
    for png in ("throughput_vs_n", "efficiency_vs_length", "ablations"):
        assert (tmp_path / f"bench_{png}.png").stat().st_size > 1000
    assert [n for n, _ in series_vs_n(result["runs"])["official"]] == [1]  # measured N only

    assert "## Second table: pair `tiny`" in md
    other = copy.deepcopy(result)
    chat = run_of(other, FULL, "short", 1)
    chat.update(source="chat", prompt_tokens_mean=61.4)
    other["gpu"] = "NVIDIA H200"
    other["plan"]["repeats"] = 3
    for r in other["runs"]:
        r["throughputs"] = [r["output_throughput"]]
    md2 = render(other, tmp_path / "other.md")
    assert "GPU NVIDIA H200 present, not used" in md2 and "no GPU" not in md2
    assert "ran 3 time(s)" in md2
    assert f"| {FULL} | short (chat ~61->{chat['max_tokens']}) | 1 |" in md2
    assert "repeats differed" in md and "repeats differed" not in md2


def test_the_headline_block_is_written_from_the_files_it_names(
    result: Data, tmp_path: Path
) -> None:
    """`bench report --headline`: the block's rows and command come from its file, the
    text around it stays, a second pass changes nothing, a changed file changes it."""
    folder = tmp_path / "results" / "run"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(result))
    doc = tmp_path / "docs" / "benchmarks.md"
    doc.parent.mkdir()
    name = "results/run/result.json"
    doc.write_text(f"# Method\n\n{headline.OPEN}{name} -->\nstale\n{headline.CLOSE}\n\nEnd.\n")
    assert headline.update(doc, tmp_path)
    text = doc.read_text()
    assert text.startswith("# Method\n\n") and text.endswith(f"{headline.CLOSE}\n\nEnd.\n")
    assert "stale" not in text and "[result](../results/run/result.json)" in text
    for row in rows_of(result).values():
        assert (f"| `smoke` |{row.markdown()[1:]}" in text) == (row.measured != "not run")
    assert f"`tokenrouterd bench compare --plan smoke --pair tiny --cache-dir {CACHE_DIR} " \
        f"--out {name}`" in text  # fmt: skip
    assert not headline.update(doc, tmp_path)
    faster = copy.deepcopy(result)
    run_of(faster, FULL, "short", max(PLANS["smoke"].ns))["output_throughput"] *= 2
    (folder / "result.json").write_text(json.dumps(faster))
    assert headline.update(doc, tmp_path) and doc.read_text() != text


def test_the_batching_bound_counts_the_runs_batches_at_calibrated_costs(result: Data) -> None:
    costs = result["step_costs"]
    assert set(costs) == {"small", "large"}
    for c in costs.values():
        assert [b for b, _ in c["decode_ms"]] == list(BATCHES)
        assert all(ms > 0 for _, ms in c["decode_ms"]) and c["prefill_ms"][0] > BATCHES[-1]
    for run in result["runs"]:
        if run["system"] == "official" or run["system"] == "std":
            assert "batching" not in run
            continue
        b, c = run["batching"], run["ceiling"]
        for name, m in b["models"].items():  # the same steps as the engines' counters
            assert (m["steps"], m["rows"]) == (
                c["models"][name]["steps"],
                c["models"][name]["rows"],
            )
            assert m["sampled_steps"] == m["steps"] and m["need_s"] > 0
        assert b["bound_s"] == max(m["need_s"] for m in b["models"].values())
        assert b["fraction"] == pytest.approx(b["bound_s"] / run["duration_s"])


def test_a_batching_bound_above_the_run_or_unmet_is_judged(result: Data) -> None:
    top = max(PLANS["smoke"].ns)
    judged = copy.deepcopy(result)
    b = run_of(judged, "tokenrouterd", "short", top)["batching"]
    b["fraction"] = 1.2
    row = rows_of(judged)["throughput / batching bound"]
    assert row.verdict == "not comparable" and "calibration ran slow" in row.why
    b["fraction"] = 0.5
    assert rows_of(judged)["throughput / batching bound"].verdict == "missed"
    b["fraction"] = 0.9
    assert rows_of(judged)["throughput / batching bound"].verdict == "met"


def test_single_user_is_compared_with_the_loop_on_its_own_prompts(result: Data) -> None:
    one = run_of(result, FULL, "short", 1)
    ref = official_on(result["runs"], one)
    assert ref is not None and ref["prompt_set"] == one["prompt_set"]
    tokens = sum(r["output_tokens"] for r in ref["records"])
    assert ref["output_throughput"] == tokens / sum(r["latency_s"] for r in ref["records"])
    name = "tokenrouterd N=1 / official"
    assert rows_of(result)[name].verdict in {"met", "missed"}
    slow = copy.deepcopy(result)
    for r in run_of(slow, "official", "short", 1)["records"]:
        r["latency_s"] = 1e6  # a loop this slow: tokenrouterd at N=1 beats it
    assert rows_of(slow)[name].verdict == "met"
    fast = copy.deepcopy(result)
    for r in run_of(fast, "official", "short", 1)["records"]:
        r["latency_s"] = 1e-6
    assert rows_of(fast)[name].verdict == "missed"
