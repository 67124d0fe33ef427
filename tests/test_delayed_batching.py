"""Delayed batching: thresholds gate launches, never deadlock, never change outputs.

The launch rule is pure Python: its tests use plain objects for the runnable requests
and real shared counters, no model. The process test checks the rule is in force in
real engines (they report launches held back for a batch) and changes nothing produced.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from trd.bench.engines import run_closed_loop
from trd.engines.launch import BARRIER_POLL_S, BarrierRule, LaunchRule, make_launch_rule
from trd.engines.spec import BatchingSettings, EngineSpec
from trd.ipc.counters import Counters
from trd.supervisor.group import EngineGroup

from routing_cases import jobs, reference, specs


@dataclass
class Waiting:
    runnable_since: float


def with_thresholds(
    spec: EngineSpec, thresholds: tuple[int, ...], max_wait_ms: float
) -> EngineSpec:
    batching = BatchingSettings(max_wait_ms=max_wait_ms)
    return dataclasses.replace(spec, thresholds=thresholds, batching=batching)


@pytest.fixture
def counters() -> Iterator[Counters]:
    c = Counters.create(f"trd-test-counters-{time.monotonic_ns()}", 2)
    yield c
    c.close()


@pytest.fixture(scope="module")
def spec(tiny_models: dict[str, Path]) -> EngineSpec:
    return EngineSpec.of(tiny_models["small"], index=0, num_models=2, kv_tokens=64)


def test_launch_waits_for_threshold_then_for_max_wait(spec: EngineSpec, counters: Counters) -> None:
    rule = LaunchRule(with_thresholds(spec, (1, 3), max_wait_ms=50), counters)
    assert rule.delay(0.0, []) == float("inf")  # nothing runnable
    one = [Waiting(10.0)]
    counters.set_active(2)
    counters.set_busy(1, 1)  # the other engine is working: more may arrive
    assert rule.delay(10.0, one) == pytest.approx(0.05)  # B = 3 for 2 active requests
    assert rule.delay(10.03, one) == pytest.approx(0.02)
    assert rule.delay(10.06, one) == 0.0  # the oldest waited max_wait: launch
    assert (rule.held_launches, rule.held_seconds) == (1, pytest.approx(0.06))
    counters.set_active(1)
    assert rule.delay(10.0, one) == 0.0  # B = 1 for 1 active request
    counters.set_active(2)
    counters.set_busy(1, 0)
    assert rule.delay(10.0, one) == 0.0  # nothing runnable elsewhere: waiting would deadlock
    counters.set_busy(1, 1)
    assert rule.delay(10.0, [Waiting(10.0)] * 3) == 0.0  # 3 runnable >= B
    counters.set_active(50)
    assert rule.delay(10.0, [Waiting(10.0)] * 3) == 0.0  # past the list: its last entry


def test_bad_thresholds_are_rejected(spec: EngineSpec, counters: Counters) -> None:
    rule = LaunchRule(spec, counters)
    for bad in ([], [0, 2], [1, True], [1.5]):
        with pytest.raises(ValueError, match="thresholds must be"):
            rule.set(bad, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_wait_ms"):
        rule.set([1], -1)
    assert rule.thresholds == [1]


def test_step_sync_waits_for_busy_peers_to_finish_the_step(
    spec: EngineSpec, counters: Counters
) -> None:
    synced = dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, step_sync=True))
    rule = make_launch_rule(synced, counters)
    assert isinstance(rule, BarrierRule)
    assert type(make_launch_rule(spec, counters)) is LaunchRule  # chosen once, at start
    one = [Waiting(0.0)]
    counters.set_busy(1, 1)
    counters.set_steps(1, 7)
    assert rule.delay(0.0, one) == 0.0  # joined after idling: caught up to 7
    assert counters.steps(0) == 7
    rule.stepped()  # forward 8
    assert counters.steps(0) == 8
    assert rule.delay(0.0, one) == BARRIER_POLL_S  # the peer is still at 7
    counters.set_steps(1, 8)
    assert rule.delay(0.0, one) == 0.0
    rule.stepped()
    counters.set_busy(1, 0)  # an idle peer holds nobody back
    assert rule.delay(0.0, one) == 0.0


def test_thresholds_hold_launches_in_real_engines_and_keep_outputs(
    tiny_models: dict[str, Path],
) -> None:
    """sum(B_i - 1) = 6 >= N = 2: only the guards (max_wait, idle peers) let it finish."""
    paths = [tiny_models["small"], tiny_models["large"]]
    work = jobs(paths[0], 6)
    policy, params = "scripted", {"schedule": [0, 1, 1, 0]}
    expected = reference(paths, policy, params, work)
    delayed = [with_thresholds(s, (4,), max_wait_ms=5.0) for s in specs(paths, policy, params)]
    group = EngineGroup(delayed)
    group.start()
    try:
        results = run_closed_loop(group, work, concurrency=2, timeout=120)
        group.stats.clear()
        for i in range(len(paths)):  # fresh stats from every engine
            group.control(i, {"op": "stats"})
        deadline = time.monotonic() + 30
        while len(group.stats) < len(paths) and time.monotonic() < deadline:
            group.pump(timeout=0.1)
        held = [group.stats[i]["held_launches"] for i in range(len(paths))]
    finally:
        group.close()
    assert [(r.tokens, r.models) for r in results] == [(t.tokens, t.models) for t in expected]
    assert sum(held) > 0  # launches waited for a batch that could not fill (B = 1: never)
