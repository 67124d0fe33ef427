"""The hub between handlers and engines: admission, token delivery, aborts, draining."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from trd.engines.tracker import Tracked
from trd.frontend.hub import Hub
from trd.frontend.openai_api import ApiError
from trd.protocol import FinishReason, SamplingParams


class FakeGroup:
    """Records what the hub asks of the engine group."""

    def __init__(self) -> None:
        self.listener: Any = None
        self.next_rid = 0
        self.aborted: list[int] = []
        self.forgotten: list[int] = []
        self.active: list[int] = []

    def submit(self, prompt: list[int], params: SamplingParams) -> int:
        self.next_rid += 1
        return self.next_rid

    def abort(self, rid: int) -> None:
        self.aborted.append(rid)

    def forget(self, rid: int) -> None:
        self.forgotten.append(rid)

    def set_active(self, n: int) -> None:
        self.active.append(n)

    def emit(self, rid: int, pairs: list[tuple[int, int]], finish: FinishReason) -> None:
        tracked = Tracked(rid)
        tracked.finish = finish
        self.listener(tracked, pairs)


def make_hub(max_inflight: int = 4) -> tuple[Hub, FakeGroup]:
    hub, group = Hub(max_inflight), FakeGroup()
    hub.attach(group)  # type: ignore[arg-type]
    return hub, group


async def collect(gen: Any) -> list[list[int]]:
    return [ids async for ids in gen.chunks()]


def test_tokens_reach_the_generation_and_a_finished_request_is_forgotten() -> None:
    async def run() -> None:
        hub, group = make_hub()
        gen = hub.submit([1, 2], SamplingParams())
        group.emit(gen.rid, [(7, 0), (8, 1)], FinishReason.NONE)
        group.emit(gen.rid, [(9, 1)], FinishReason.LENGTH)
        assert await collect(gen) == [[7, 8], [9]]
        assert (gen.models, gen.finish) == ([0, 1, 1], FinishReason.LENGTH)
        hub.release(gen)
        assert (group.forgotten, group.aborted, group.active) == ([1], [], [0, 1, 0])

    asyncio.run(run())


def test_releasing_a_running_request_aborts_it_on_the_engines() -> None:
    async def run() -> None:
        hub, group = make_hub()
        gen = hub.submit([1], SamplingParams())
        hub.release(gen)  # client left, or a stop string matched
        hub.release(gen)  # idempotent
        assert group.aborted == [gen.rid]
        assert hub.idle.is_set()

    asyncio.run(run())


def test_admission_refuses_when_not_serving_or_overloaded() -> None:
    async def run() -> None:
        hub, _ = make_hub(max_inflight=2)
        hub.submit([1], SamplingParams())
        hub.submit([1], SamplingParams())
        with pytest.raises(ApiError, match="overloaded") as err:
            hub.submit([1], SamplingParams())
        assert err.value.status == 503
        hub.detach("draining", "server shutting down")
        with pytest.raises(ApiError, match="server shutting down"):
            hub.submit([1], SamplingParams())

    asyncio.run(run())


def test_detach_fails_running_requests_with_503_and_drain_waits_for_them() -> None:
    async def run() -> None:
        hub, _ = make_hub()
        gen = hub.submit([1], SamplingParams())
        assert not await hub.drain(0.05)
        hub.detach("restarting", "engine 'large' died")
        assert await collect(gen) == []
        assert (gen.finish, gen.error_status) == (FinishReason.ERROR, 503)
        hub.release(gen)
        assert await hub.drain(0.05)

    asyncio.run(run())
