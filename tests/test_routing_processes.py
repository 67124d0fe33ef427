"""Engine processes over shared-memory rings against the reference loop (float64).

16 requests (the slow tier: 32), outputs of 16 to 256 tokens, run at concurrency 1 then
16 (the slow tier: 1 then 4 too) for one case per commit, every policy in the slow
tier, with each engine's prefix cache on (the
later run finds the prompts of the run at 1 cached); committed tokens and the producing
model of each token must equal the reference loop's, and every model must have fed or
taken from its cache each token of its sequences exactly once.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from trd.bench.engines import run_closed_loop
from trd.models.checkpoint import CheckpointError
from trd.protocol import FinishReason, SamplingParams
from trd.supervisor.group import EngineGroup, EngineStartError
from trd.testing.wiring import check_fed

from routing_cases import (
    MODEL_SETS,
    cache_hits,
    fresh_stats,
    jobs,
    process_cases,
    reference,
    specs,
)


def shm_segments(prefix: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


# Two-model ensemble and scripted runs are covered in-process (test_routing_inprocess).
CASE_IDS = ["rstitch-2", "rstitch-3", "citer", "r2r", "collm", "glimp", "ensemble-3", "scripted-3"]


# Per commit, one case (three models) with 16 requests at 1 and 16 in flight: the processes
# and rings are the same whatever the policy, and every policy's decision rule is checked
# against the loop per commit in-process (test_routing_inprocess). The slow tier: every
# case at 1 and 16, and 32 requests at 1 and 4.
PER_COMMIT = ("rstitch-3",)
RUNS = [
    pytest.param(case, ((1, 16), 16), id=f"{name}-c1+16",
                 marks=() if name in PER_COMMIT else pytest.mark.slow)
    for case, name in enumerate(CASE_IDS)
] + [
    pytest.param(case, ((1, 4), 32), id=f"{name}-c1+4", marks=pytest.mark.slow)
    for case, name in enumerate(CASE_IDS)
]  # fmt: skip


@pytest.mark.parametrize(("case", "concurrencies"), RUNS)
def test_engines_equal_the_reference_at_every_concurrency(
    tiny_models: dict[str, Path], heads: dict[str, Path], case: int,
    concurrencies: tuple[tuple[int, ...], int],
) -> None:  # fmt: skip
    policy, params, n_models = process_cases(heads)[case]
    paths = [tiny_models[n] for n in MODEL_SETS[n_models]]
    levels, count = concurrencies
    work = jobs(paths[0], count)
    expected = reference(paths, policy, params, work)
    produced = {m for t in expected for m in t.models}
    assert len(produced) == n_models, f"workload must exercise every model, got {produced}"
    group = EngineGroup(specs(paths, policy, params))
    group.start()
    try:
        before = cache_hits(group, n_models)
        for concurrency in levels:
            results = run_closed_loop(group, work, concurrency)
            for i, (got, want) in enumerate(zip(results, expected, strict=True)):
                assert got.error == "", got.error
                assert got.tokens == want.tokens, f"c={concurrency} request {i}"
                assert got.models == want.models, f"c={concurrency} request {i}"
                assert got.finish == want.finish
            # Work accounting: each model fed every token of the sequence it ran on, or
            # took it from its prefix cache, exactly once (never again on a return). The
            # runs at 4 and 16 repeat the prompts of the run at 1: their blocks are cached.
            after = cache_hits(group, n_models)
            hits = {m: after[m] - before[m] for m in after}
            check_fed(results, expected, hits)
            assert concurrency == 1 or hits[0] > 0, hits
            before = after
            if concurrency == 1:  # one request alternates: each forward may take both cores
                assert all(fresh_stats(group, m)["wide_forwards"] > 0 for m in range(n_models))
    finally:
        group.close()
    assert shm_segments(group.prefix) == []


def test_killed_engine_fails_its_requests_cleanly(tiny_models: dict[str, Path]) -> None:
    paths = [tiny_models["small"], tiny_models["large"]]
    group = EngineGroup(specs(paths, "scripted", {"schedule": [0, 1]}))
    group.start()
    try:
        params = SamplingParams(max_tokens=2000, ignore_eos=True)
        gens = [group.submit([5, 6, 7, 8], params) for _ in range(4)]
        while sum(len(g.tokens) for g in gens) < 20:
            group.pump(timeout=0.1)
        pid = group.procs[1].pid
        assert pid is not None  # started
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not all(g.complete for g in gens):
            assert time.monotonic() < deadline, "requests hang after an engine died"
            group.pump(timeout=0.1)
        for g in gens:
            assert g.finish is FinishReason.ERROR
            assert "engine 'large'" in g.error
            assert "died" in g.error
        with pytest.raises(RuntimeError, match="degraded"):
            group.submit([1, 2], params)
    finally:
        group.close()
    assert shm_segments(group.prefix) == []


def test_broken_checkpoint_names_the_engine(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    paths = [tiny_models["small"], tmp_path]  # an empty directory is not a checkpoint
    with pytest.raises(
        CheckpointError, match=rf"{tmp_path}: missing config.json"
    ):  # the supervisor reads every checkpoint before it starts any engine
        specs(paths, "rstitch", {"threshold": 0.5})


def test_engine_that_cannot_load_names_itself(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_models["large"], broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])  # header whole, data cut short
    group = EngineGroup(specs([tiny_models["small"], broken], "rstitch", {"threshold": 0.5}))
    with pytest.raises(EngineStartError, match=r"engine 'broken' failed to start: .*safetensors"):
        group.start(timeout=120)
    assert shm_segments(group.prefix) == []
