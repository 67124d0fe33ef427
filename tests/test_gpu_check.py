"""The GPU check's own parts, on CPU: the script stops cleanly without a device, its dry
run walks every stage (float32, tiny shaped models, the daemon without MPS) to a PASS,
the summary's first line says how far a run got, the attention harness tells a right
backend from a wrong one, the routed-pair driver gives the tokens the shaped weights
make, padded or not, and the graph pool is read from the allocator's segments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trd.testing.attention_cases
from trd.bench.stages import Stages, verdict
from trd.engines.graphs import StepGraphs, pool_bytes
from trd.models.attention.torch_paged import TorchPagedAttention
from trd.testing.attention_cases import CASES, HEADS, check_all
from trd.testing.shaped import POLICY, SCHEDULE, Shape, expected_tokens, jobs, write_checkpoint
from trd.testing.wiring import Wiring

from background import Finished

REPO = Path(__file__).resolve().parents[1]
STAGES = ["versions", "checkpoints", "attention", "engines", "mps", "memory", "throughput",
          "suite"]  # fmt: skip


def check_command(tmp_path: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    env = {"PYTHON": sys.executable, "GPU_CHECK_WORK": str(tmp_path / "work")}
    return ["bash", str(REPO / "scripts" / "gpu_check.sh"), *args, str(tmp_path / "out")], env


def run_check(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv, env = check_command(tmp_path, *args)
    return subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=900)  # fmt: skip


def dry_run(work: Path) -> tuple[list[str], dict[str, str]]:
    return check_command(work, "--dry-run")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_the_check_stops_cleanly_without_a_cuda_device(tmp_path: Path) -> None:
    done = run_check(tmp_path)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "no CUDA device" in done.stderr
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert text.startswith("NO DEVICE: no CUDA device, nothing was checked")
    results = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert results["versions"]["torch"] == torch.__version__


@pytest.mark.slow  # the check's start is tested above, the gpu plan's code in test_gpu_bench
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_the_bench_mode_runs_the_gpu_plan_and_stops_without_a_device(tmp_path: Path) -> None:
    """`--bench`: the check's setup, then `bench compare --plan gpu` (docs/gpu.md)."""
    done = run_check(tmp_path, "--bench")
    assert done.returncode == 3, done.stderr[-2000:]
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert text.startswith("NO DEVICE: no CUDA device, nothing was measured"), text
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["kind"] == "bench compare" and result["plan_name"] == "gpu"


@pytest.mark.slow  # up to 15 minutes of both cores; the stages' parts are tested below
@pytest.mark.background.with_args(dry_run)
def test_the_dry_run_walks_every_stage_to_a_pass(finished: Finished) -> None:
    """Every stage's code on the CPU: a Python error anywhere fails its stage and the run.
    (Run from collection on: tests/background.py.)"""
    tmp_path = finished.work
    text = (tmp_path / "out" / "summary.txt").read_text()
    assert finished.returncode == 0, text + finished.stderr[-3000:]
    assert text.splitlines()[:2] == ["PASS: all 8 stages", "GPU check (dry run, CPU)"]
    results = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert list(results) == STAGES
    assert results["engines"]["graphs_on"]["replays"] > 0  # padded into the buckets
    for qwen2 in ("qwen2-small", "qwen2-large"):  # the demo pair's architecture, biases on
        assert results["engines"][qwen2]["as_designed"], results["engines"][qwen2]
    assert results["mps"]["tokens_exact"] and len(results["mps"]["engines"]) == 2
    assert results["attention"]["head_dim_32_backend"] == "torch"
    suite = results["suite"]  # test_flashinfer.py alone, every test skipped on the CPU
    assert suite["tests"] == suite["skipped"] > 0 and suite["failures"] == suite["errors"] == 0


def test_the_first_line_says_how_far_a_run_got(tmp_path: Path) -> None:
    stages = ("versions", "attention", "engines")
    ok, bad = {"ok": True}, {"ok": False, "error": "exit 1"}
    assert verdict({}, stages) == "INCOMPLETE: 0 of 3 stages passed, last none"
    assert verdict({"versions": ok}, stages) == "INCOMPLETE: 1 of 3 stages passed, last versions"
    failed = verdict({"versions": ok, "attention": bad}, stages)
    assert failed == "FAIL: attention (2 of 3 stages ended)"
    assert verdict(dict.fromkeys(stages, ok), stages) == "PASS: all 3 stages"
    # The runner rewrites the summary after every stage; a stage it has no time for is
    # recorded as not run, and one stopped at its limit keeps what it had written.
    run = Stages(tmp_path / "out", 60, tmp_path / "work", lambda r: verdict(r, stages))
    code = "import json, sys, time; json.dump({'part': 1}, open(sys.argv[1], 'w')); time.sleep(30)"
    argv = [sys.executable, "-c", code, str(run.result_path("versions"))]
    result = run.step("versions", 3, argv)
    assert result is not None and result["part"] == 1 and not result["ok"]
    assert "time limit" in result["error"]
    assert (tmp_path / "out/summary.txt").read_text() == verdict(run.results, stages)
    run.deadline = 0.0
    assert run.step("attention", 10, [sys.executable, "-c", "pass"]) is None
    assert run.results["attention"]["error"] == "not run: out of time"


def test_the_graph_pool_is_the_allocators_segments_of_that_pool() -> None:
    snapshot = [
        {"total_size": 20 << 20, "segment_pool_id": (0, 7)},  # the graphs' pool
        {"total_size": 2 << 20, "segment_pool_id": (0, 7)},
        {"total_size": 64 << 20, "segment_pool_id": (0, 0)},  # the default pool
        {"total_size": 2 << 20, "segment_pool_id": (0, 3)},  # another pool
    ]
    assert pool_bytes(snapshot, (0, 7)) == 22 << 20


def test_the_attention_harness_passes_a_right_backend_and_fails_a_wrong_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = check_all("torch", torch.float64, "cpu")
    assert len(rows) == len(CASES) * len(HEADS) and all(r["ok"] for r in rows)
    assert max(r["out_err"] for r in rows) < 1e-5  # float64 vs its float32 copy

    class OffByOne(TorchPagedAttention):  # writes each new token's K/V one row off
        def attend(self, q, k, v, kv_cache):  # type: ignore[no-untyped-def]
            return super().attend(q, k.roll(1, 0), v.roll(1, 0), kv_cache)

    monkeypatch.setattr(trd.testing.attention_cases, "make_backend", lambda *a: OffByOne(a[1]))
    rows = check_all("torch", torch.float32, "cpu")
    assert not any(r["ok"] for r in rows)


@pytest.fixture(scope="module")
def mini_pair(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The shaped pair's construction (tied repeats, untied adds one) at a tiny size."""
    root = tmp_path_factory.mktemp("shaped")
    return [write_checkpoint(Shape(f"mini-{t}", 64, 128, 2, 4, 2, tied=t, head_dim=16,
                                   vocab=4096), root) for t in (True, False)]  # fmt: skip


@pytest.mark.parametrize("padded", [False, True])
def test_the_routed_pair_writes_the_designed_tokens(mini_pair: list[Path], padded: bool) -> None:
    pair = Wiring.of(mini_pair, POLICY, kv_tokens=8192, max_batch_size=16)
    if padded:  # the CUDA-graph path without the capture
        for node in pair.engines:
            runner = node.engine.runner
            runner.graphs = StepGraphs(runner, node.engine.spec.settings, capture=False)
    gens = pair.run(jobs())
    assert [g.tokens for g in gens] == [expected_tokens(p, sp.max_tokens, SCHEDULE)
                                        for p, sp in jobs()]  # fmt: skip
    # Every position class: the first token from the large model, the last from each.
    assert all(g.models[0] == 1 for g in gens)
    assert {g.models[-1] for g in gens} == {0, 1}
    if padded:
        for n in pair.engines:
            graphs = n.engine.runner.graphs
            assert graphs is not None and graphs.used.total() > 5


# What the device image's Python already holds of the package's dependencies (the
# device's KINDS.md list, read 2026-11-17; the first device run, 2026-12-04, imported
# them). gguf is only for `tokenrouterd import-gguf`, which the check never runs.
ON_THE_DEVICE = {"torch", "numpy", "safetensors", "tokenizers", "pyyaml", "tqdm",
                 "transformers", "scipy", "aiohttp", "uvloop", "prometheus-client",
                 "nvidia-ml-py"}  # fmt: skip
NOT_ON_THE_CHECKS_PATH = {"gguf"}


def test_every_dependency_travels_or_is_on_the_device() -> None:
    """llguidance (added for structured outputs) was a dependency that neither the device
    nor the carried wheels had: every engine's import would have failed there. Found by
    reading, just before the first device run."""
    import re
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~ \[;]", d, maxsplit=1)[0].lower() for d in deps}
    prepare = (REPO / "scripts/gpu_check_prepare.sh").read_text()
    carried = {m.lower() for m in re.findall(r"([A-Za-z0-9_.-]+)==[0-9]", prepare)}
    assert names - ON_THE_DEVICE - NOT_ON_THE_CHECKS_PATH - carried == set()
