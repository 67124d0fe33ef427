"""Scheduler behaviour with exact expectations: budget, chunking, order, admission."""

from __future__ import annotations

import pytest

from trd.engines.pages import PageAllocator
from trd.engines.request import Request, State
from trd.engines.scheduler import RequestTooLarge, Scheduler
from trd.engines.spec import EngineSettings
from trd.protocol import SamplingParams


def make(num_pages: int = 16, page_size: int = 4, budget: int = 16, size: int = 8) -> Scheduler:
    settings = EngineSettings(max_batch_tokens=budget, max_batch_size=size)
    return Scheduler(PageAllocator(num_pages, page_size), settings, max_model_len=64)


def req(rid: int, prompt: int, max_tokens: int = 4, priority: int = 0) -> Request:
    params = SamplingParams(max_tokens=max_tokens, priority=priority)
    return Request(rid, list(range(prompt)), prompt, params, arrival=rid)


def run(sched: Scheduler) -> list[tuple[int, int, bool]]:
    """One step with the model stubbed out: anchors advance, completed feeds commit a token."""
    out = []
    for item in sched.schedule():
        out.append((item.req.rid, item.num_tokens, item.completes))
        item.req.kv_len += item.num_tokens
        if item.completes:
            item.req.seq.append(0)
    return out


def test_prefill_is_chunked_by_the_token_budget_and_decode_joins() -> None:
    sched = make(budget=10)
    sched.add(req(0, prompt=3))
    sched.add(req(1, prompt=12))
    assert run(sched) == [(0, 3, True), (1, 7, False)]
    assert run(sched) == [(0, 1, True), (1, 5, True)]
    assert run(sched) == [(0, 1, True), (1, 1, True)]


def test_batch_size_limit_keeps_oldest_first() -> None:
    sched = make(size=2)
    for rid in range(3):
        sched.add(req(rid, prompt=2))
    assert [rid for rid, _, _ in run(sched)] == [0, 1]


def test_pending_requests_take_no_compute_and_return_with_only_the_suffix() -> None:
    sched = make()
    r = req(0, prompt=5)
    sched.add(r)
    run(sched)
    r.state = State.PENDING
    assert run(sched) == []
    r.seq.extend([7, 8])  # a peer committed two tokens
    r.state = State.RUNNING
    assert run(sched) == [(0, 3, True)]  # the token it sampled itself + the two new ones


def test_request_that_never_fits_is_rejected_with_the_numbers() -> None:
    sched = make(num_pages=4, page_size=4)
    with pytest.raises(RequestTooLarge, match="exceeds the maximum context length 64"):
        sched.add(req(0, prompt=60, max_tokens=10))
    with pytest.raises(RequestTooLarge, match="need 5 KV pages, the engine has 4"):
        sched.add(req(1, prompt=17, max_tokens=3))


def test_request_waits_when_pages_are_short_and_runs_after_a_finish() -> None:
    sched = make(num_pages=4, page_size=4)
    sched.add(req(0, prompt=12, max_tokens=4))  # 3 pages now
    run(sched)
    sched.add(req(1, prompt=8, max_tokens=4))  # needs 2 pages, 1 free, may not preempt older
    assert [rid for rid, _, _ in run(sched)] == [0]
    assert sched.requests[1].pages == []
    sched.finish(sched.requests[0])
    assert run(sched) == [(1, 8, True)]
    sched.check_integrity()


def test_older_request_preempts_the_newest_page_holder() -> None:
    sched = make(num_pages=4, page_size=4, size=1)
    old, new = req(0, prompt=4, max_tokens=8), req(1, prompt=8, max_tokens=4)
    sched.add(old)
    sched.add(new)
    run(sched)  # old: 1 page
    old.state = State.PENDING
    run(sched)  # new: 2 pages
    old.state = State.RUNNING
    old.seq.extend(range(6))  # 11 tokens, 4 cached: needs 3 pages, holds 1, 1 free
    assert run(sched) == [(0, 7, True)]
    assert new.pages == [] and new.kv_len == 0 and new.state is State.WAITING
    sched.check_integrity()


def test_priority_orders_the_batch_lower_first_and_ties_by_arrival() -> None:
    sched = make(size=2, budget=64)
    for rid, priority in enumerate([1, 0, 2, 0, -3]):
        sched.add(req(rid, prompt=2, max_tokens=16, priority=priority))
    assert [rid for rid, _, _ in run(sched)] == [4, 1]
    sched.finish(sched.requests[4])
    assert [rid for rid, _, _ in run(sched)] == [1, 3]
    for rid in (1, 3):
        sched.finish(sched.requests[rid])
    assert [rid for rid, _, _ in run(sched)] == [0, 2]


def test_a_high_priority_arrival_takes_a_running_request_s_place_and_it_keeps_its_pages() -> None:
    sched = make(size=1)
    low = req(0, prompt=4, max_tokens=8, priority=5)
    sched.add(low)
    assert run(sched) == [(0, 4, True)]
    sched.add(req(1, prompt=3, priority=-1))  # a handoff entering a peer's queue: the same
    assert run(sched) == [(1, 3, True)]
    assert run(sched) == [(1, 1, True)]  # strict: no aging
    assert low.state is State.RUNNING and low.kv_len == 4 and len(low.pages) == 1
    sched.finish(sched.requests[1])
    assert run(sched) == [(0, 1, True)]  # back, without recomputing


def test_page_pressure_preempts_the_lowest_priority_holder_never_a_higher_one() -> None:
    sched = make(num_pages=4, page_size=4, size=1)
    low = req(0, prompt=8, max_tokens=4, priority=1)  # older, but lower priority
    sched.add(low)
    run(sched)  # low: 2 pages
    high = req(1, prompt=9, max_tokens=4, priority=0)  # needs 3 pages, 2 free
    sched.add(high)
    assert run(sched) == [(1, 9, True)]
    assert low.pages == [] and low.kv_len == 0 and low.state is State.WAITING
    assert sched.preemptions == 1
    sched.check_integrity()
    # The other way round: a low-priority request waits for pages instead.
    sched = make(num_pages=4, page_size=4, size=1)
    high = req(0, prompt=8, max_tokens=4, priority=0)
    sched.add(high)
    run(sched)
    high.state = State.PENDING  # away at a peer, its pages kept
    sched.add(req(1, prompt=9, max_tokens=4, priority=1))
    assert run(sched) == []
    assert len(high.pages) == 2 and sched.preemptions == 0
