"""Delayed batching: thresholds gate launches, never deadlock, never change outputs."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from trd.engines.engine import Engine
from trd.engines.group import EngineGroup, run_closed_loop
from trd.engines.router import BARRIER_POLL_S, RoutingEngine
from trd.ipc.counters import Counters
from trd.policies import PolicyContext, make_policy
from trd.protocol import SamplingParams, Submit

from routing_cases import jobs, specs


@pytest.fixture
def counters() -> Iterator[Counters]:
    c = Counters.create(f"trd-test-counters-{time.monotonic_ns()}", 2)
    yield c
    c.unlink()


def router(path: Path, counters: Counters) -> RoutingEngine:
    """Model 0 of two, with a policy that never hands off."""
    engine = Engine(path, kv_tokens=4096)
    ctx = PolicyContext(0, 2, engine.runner.model.model.embed_tokens)
    r = RoutingEngine(
        engine, make_policy("scripted", ctx, {"schedule": [0]}), 0, 2, lambda *a: None
    )
    r.counters = counters
    return r


def test_launch_waits_for_threshold_then_for_max_wait(
    tiny_models: dict[str, Path], counters: Counters
) -> None:
    r = router(tiny_models["small"], counters)
    r.set_thresholds([1, 3], max_wait_ms=50)
    assert r.launch_delay(time.perf_counter()) == float("inf")  # nothing runnable
    r.handle(Submit(1, np.array([5, 6], np.int32), SamplingParams(), 0.0))
    counters.set_active(2)
    counters.set_busy(1, 1)  # the other engine is working: more may arrive
    now = time.perf_counter()
    assert 0.0 < r.launch_delay(now) <= 0.05  # B = 3 for 2 active requests
    assert r.launch_delay(now + 0.06) == 0.0  # the oldest waited max_wait: launch
    counters.set_active(1)
    assert r.launch_delay(now) == 0.0  # B = 1 for 1 active request
    counters.set_active(2)
    counters.set_busy(1, 0)
    assert r.launch_delay(now) == 0.0  # nothing runnable elsewhere: waiting would deadlock
    r.handle(Submit(2, np.array([7], np.int32), SamplingParams(), 0.0))
    r.handle(Submit(3, np.array([8], np.int32), SamplingParams(), 0.0))
    counters.set_busy(1, 1)
    assert r.launch_delay(now) == 0.0  # 3 runnable >= B


def test_bad_thresholds_are_rejected(tiny_models: dict[str, Path], counters: Counters) -> None:
    r = router(tiny_models["small"], counters)
    with pytest.raises(ValueError, match="thresholds must be"):
        r.set_thresholds([0, 2], 10)
    with pytest.raises(ValueError, match="max_wait_ms"):
        r.set_thresholds([1], -1)


def test_thresholds_violating_the_rule_still_finish_and_keep_outputs(
    tiny_models: dict[str, Path],
) -> None:
    """sum(B_i - 1) = 6 >= N = 2: only the guards (max_wait, idle peers) let it finish."""
    paths = [tiny_models["small"], tiny_models["large"]]
    work = jobs(paths[0], 6)
    plain = specs(paths, "scripted", {"schedule": [0, 1, 1, 0]})
    delayed = [dataclasses.replace(s, thresholds=(4,), max_wait_ms=5.0) for s in plain]
    outputs = []
    for group_specs in (plain, delayed):
        group = EngineGroup(group_specs)
        group.start()
        try:
            start = time.monotonic()
            results = run_closed_loop(group, work, concurrency=2, timeout=120)
            outputs.append([(r.tokens, r.models) for r in results])
            assert time.monotonic() - start < 120
        finally:
            group.close()
    assert outputs[0] == outputs[1]
    assert all(len(t) > 0 for t, _ in outputs[1])


def test_step_sync_waits_for_busy_peers_to_finish_the_step(
    tiny_models: dict[str, Path], counters: Counters
) -> None:
    r = router(tiny_models["small"], counters)
    r.step_sync = True
    r.handle(Submit(1, np.array([5, 6], np.int32), SamplingParams(), 0.0))
    counters.set_busy(1, 1)
    counters.set_steps(1, 7)
    assert r.launch_delay(time.perf_counter()) == 0.0  # joined after idling: caught up to 7
    assert r.completed_steps == 7
    assert r.step()  # forward 8
    assert counters.steps(0) == 8
    assert r.launch_delay(time.perf_counter()) == BARRIER_POLL_S  # the peer is still at 7
    counters.set_steps(1, 8)
    assert r.launch_delay(time.perf_counter()) == 0.0
    r.step()
    counters.set_busy(1, 0)  # an idle peer holds nobody back
    assert r.launch_delay(time.perf_counter()) == 0.0
