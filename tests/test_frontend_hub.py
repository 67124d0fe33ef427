"""The supervisor's request state and admission: ordering, exactly-once, aborts, draining.

`Generation` is tested directly with Emits as engines send them; the `Hub` against a
stand-in group that records what it is asked (the process-level group is exercised by
the routing and e2e tests).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from trd.engines.spec import EngineSpec
from trd.protocol import Emit, FinishReason, SamplingParams
from trd.supervisor.generation import Generation, cpu_ticks, stalled_requests
from trd.supervisor.group import EngineGroup
from trd.supervisor.hub import Hub, Unavailable


def emit(
    pos: int, pairs: Sequence[tuple[int, int]], finish: FinishReason = FinishReason.NONE
) -> Emit:
    tokens = np.asarray([t for t, _ in pairs], np.int32)
    return Emit(1, pos, tokens, np.asarray([m for _, m in pairs], np.uint8), finish)


def test_out_of_order_emits_are_placed_by_position() -> None:
    gen = Generation(1, prompt_len=3)
    gen.on_emit(emit(2, [(9, 1)], FinishReason.LENGTH))
    assert (gen.tokens, gen.complete) == ([], False)  # positions 0 and 1 are missing
    gen.on_emit(emit(0, [(7, 0)]))
    assert gen.tokens == [7]
    gen.on_emit(emit(1, [(8, 0)]))
    assert (gen.tokens, gen.models, gen.complete) == ([7, 8, 9], [0, 0, 1], True)
    assert gen.changed.is_set()


def test_a_duplicate_emit_is_counted_and_ignored() -> None:
    gen = Generation(1, prompt_len=3)
    gen.on_emit(emit(0, [(7, 0), (8, 1)]))
    gen.on_emit(emit(1, [(8, 1)]))  # again, same token, same model
    gen.on_emit(emit(2, [(9, 1)], FinishReason.STOP))
    gen.on_emit(emit(2, [(9, 1)], FinishReason.STOP))
    assert (gen.tokens, gen.duplicates, gen.finish) == ([7, 8, 9], 2, FinishReason.STOP)


@pytest.mark.parametrize("pos", [0, 3])  # a released position, and one still ahead of a gap
def test_a_conflicting_emit_fails_the_request(pos: int) -> None:
    gen = Generation(1, prompt_len=3)
    gen.on_emit(emit(0, [(7, 0)]))
    gen.on_emit(emit(3, [(5, 0)]))
    gen.on_emit(emit(pos, [(6, 1)]))
    assert gen.finish is FinishReason.ERROR and gen.complete
    assert f"conflicting tokens for output position {pos}" in gen.error


def test_an_error_emit_fails_it_with_the_engines_message() -> None:
    gen = Generation(1, prompt_len=3)
    gen.on_emit(emit(0, [(7, 0)]))
    gen.on_emit(
        Emit(1, 0, np.zeros(0, np.int32), np.zeros(0, np.uint8), FinishReason.ERROR, "boom")
    )
    assert (gen.finish, gen.error, gen.error_status) == (FinishReason.ERROR, "boom", 500)


class Recorder:
    """Stands in for the engine group: records what the hub asks of it."""

    def __init__(self) -> None:
        self.next_rid = 0
        self.aborted: list[int] = []
        self.active: list[int] = []

    def submit(self, prompt: list[int], params: SamplingParams) -> Generation:
        self.next_rid += 1
        return Generation(self.next_rid, len(prompt))

    def abort(self, rid: int) -> None:
        self.aborted.append(rid)

    def set_active(self, n: int) -> None:
        self.active.append(n)


def make_hub(max_inflight: int = 4) -> tuple[Hub, Recorder]:
    hub, group = Hub(max_inflight), Recorder()
    hub.attach(group)  # type: ignore[arg-type]
    return hub, group


def test_release_frees_the_request_on_the_engines_once() -> None:
    async def run() -> None:
        hub, group = make_hub()
        (gen,) = hub.submit([1], [SamplingParams()])
        assert not hub.idle.is_set()
        hub.release(gen)  # finished, client left, or a stop string matched
        hub.release(gen)  # idempotent
        assert (group.aborted, group.active) == ([gen.rid], [0, 1, 0])
        assert hub.idle.is_set()

    asyncio.run(run())


def test_admission_refuses_when_not_serving_or_overloaded() -> None:
    async def run() -> None:
        hub, _ = make_hub(max_inflight=2)
        hub.submit([1], [SamplingParams()])
        hub.submit([1], [SamplingParams()])
        with pytest.raises(Unavailable, match="overloaded") as err:
            hub.submit([1], [SamplingParams()])
        assert (err.value.code, err.value.retry_after_s) == ("overloaded", 1)
        hub.detach("draining", "server shutting down")
        with pytest.raises(Unavailable, match="server shutting down") as err:
            hub.submit([1], [SamplingParams()])
        assert err.value.retry_after_s is None  # going away: not here

    asyncio.run(run())


def test_detach_fails_running_requests_with_503_and_drain_waits_for_them() -> None:
    async def run() -> None:
        hub, _ = make_hub()
        (gen,) = hub.submit([1], [SamplingParams()])
        assert not await hub.drain(0.05)
        hub.detach("restarting", "engine 'large' died")
        await asyncio.wait_for(gen.changed.wait(), 1)
        assert (gen.finish, gen.error_status, gen.tokens) == (FinishReason.ERROR, 503, [])
        hub.release(gen)
        assert await hub.drain(0.05)

    asyncio.run(run())


def test_a_request_queued_behind_working_engines_is_not_a_stall() -> None:
    """No progress for the limit fails a request only while an engine is silent (hung, or
    in one long forward); behind engines that keep reporting it may wait 10 limits."""
    waiting, done = Generation(1, prompt_len=3), Generation(2, prompt_len=3)
    done.fail("finished before")
    waiting.progress_at = done.progress_at = 0.0
    gens = [waiting, done]
    assert stalled_requests(gens, {0: 299.0, 1: 299.5}, 300.0, 120.0) == (1200.0, [])
    assert stalled_requests(gens, {0: 299.0, 1: 170.0}, 300.0, 120.0) == (120.0, [waiting])
    assert stalled_requests(gens, {0: 1299.0, 1: 1299.5}, 1300.0, 120.0) == (1200.0, [waiting])
    waiting.progress_at = 250.0  # it moved since: nothing to fail, whoever is silent
    assert stalled_requests(gens, {0: 299.0, 1: 0.0}, 300.0, 120.0) == (120.0, [])


def spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_an_engine_that_spends_cpu_counts_as_heard(tiny_models: dict[str, Path]) -> None:
    """One forward may outlast the stall limit on a CPU: an engine whose CPU time grows
    is working, not hung; one that is stopped or blocked (no CPU time) stays silent."""
    assert cpu_ticks(2**22 + 7) is None  # above any pid_max: no such process
    ticks = cpu_ticks(os.getpid())
    assert ticks is not None and ticks > 0
    specs = [EngineSpec.of(tiny_models[n], index=i) for i, n in enumerate(("small", "large"))]
    group = EngineGroup(specs)
    ctx = mp.get_context("fork")
    group.procs = [ctx.Process(target=spin, args=(30.0,)),
                   ctx.Process(target=time.sleep, args=(30.0,))]  # fmt: skip
    for proc in group.procs:
        proc.start()
    try:
        time.sleep(0.5)  # both children are past their start-up
        group._hear_working(1.0)  # the first look only sets the baseline
        assert group.heard == {}
        time.sleep(1.0)
        group._hear_working(2.0)
        assert group.heard == {0: 2.0}  # the sleeper spent no CPU time
    finally:
        for proc in group.procs:
            proc.kill()
            proc.join()
