"""The page allocator alone, and its invariants under a randomized scheduler workload."""

from __future__ import annotations

import random

import pytest

from trd.engines.pages import OutOfPages, PageAllocator
from trd.engines.request import Request, State
from trd.engines.scheduler import RequestTooLarge, Scheduler
from trd.engines.spec import EngineSettings
from trd.protocol import SamplingParams


def test_a_request_grows_in_one_run_and_new_requests_split_the_largest_gap() -> None:
    alloc = PageAllocator(num_pages=16, page_size=16)
    a = alloc.allocate(rid=1, count=2)
    assert a == [0, 1]  # nothing before the first gap: it starts there
    b = alloc.allocate(rid=2, count=1)
    assert b == [9]  # the middle of the gap 2..15: pages 2..8 stay for request 1
    a += alloc.allocate(rid=1, count=3, after=a[-1])
    b += alloc.allocate(rid=2, count=2, after=b[-1])
    assert (a, b) == ([0, 1, 2, 3, 4], [9, 10, 11])
    c = alloc.allocate(rid=3, count=1)
    assert c == [7]  # the first of the largest gaps (5..8, 12..15), in its middle
    alloc.check_integrity({1: a, 2: b, 3: c})
    assert alloc.num_free == 16 - 9


def test_a_taken_next_page_continues_the_request_in_a_new_run() -> None:
    alloc = PageAllocator(num_pages=8, page_size=4)
    a = alloc.allocate(rid=1, count=1)
    b = alloc.allocate(rid=2, count=1)
    assert (a, b) == ([0], [4])
    a += alloc.allocate(rid=1, count=3, after=a[-1])
    assert a == [0, 1, 2, 3]
    a += alloc.allocate(rid=1, count=2, after=a[-1])  # page 4 is b's
    assert a[4:] == [6, 7]  # the middle of gap 5..7, then on from there
    alloc.free(1, a)
    assert alloc.allocate(rid=3, count=1) == [0] and alloc.num_free == 6
    alloc.check_integrity({2: b, 3: [0]})


def test_over_allocation_raises_and_changes_nothing() -> None:
    alloc = PageAllocator(num_pages=3, page_size=4)
    alloc.allocate(rid=1, count=2)
    with pytest.raises(OutOfPages, match="asked for 2 pages, 1 free"):
        alloc.allocate(rid=2, count=2)
    assert alloc.num_free == 1


def test_freeing_a_page_owned_by_another_request_is_caught() -> None:
    alloc = PageAllocator(num_pages=2, page_size=4)
    alloc.allocate(rid=1, count=1)
    with pytest.raises(AssertionError, match="owned by 1"):
        alloc.free(2, [0])


def test_integrity_check_detects_leaks_and_double_ownership() -> None:
    alloc = PageAllocator(num_pages=3, page_size=4)
    pages = alloc.allocate(rid=1, count=2)
    with pytest.raises(AssertionError):
        alloc.check_integrity({})  # request 1's pages are not listed: leaked
    with pytest.raises(AssertionError, match="two page tables"):
        alloc.check_integrity({1: pages, 2: pages[:1]})


def test_pages_for_rounds_up() -> None:
    alloc = PageAllocator(num_pages=1, page_size=16)
    assert [alloc.pages_for(n) for n in (0, 1, 16, 17)] == [0, 1, 1, 2]


@pytest.mark.parametrize("seed", range(5))
def test_randomized_workload_keeps_every_page_owned_once(seed: int) -> None:
    """add / step / abort / finish / park at random; invariants hold after every action."""
    rng = random.Random(seed)
    alloc = PageAllocator(num_pages=24, page_size=4)
    sched = Scheduler(alloc, EngineSettings(max_batch_tokens=24, max_batch_size=6), 64)
    next_rid = 0
    for tick in range(600):
        action = rng.random()
        if action < 0.25:
            prompt = rng.randint(1, 30)
            params = SamplingParams(max_tokens=rng.randint(1, 34))
            try:
                sched.add(Request(next_rid, [1] * prompt, prompt, params, arrival=tick))
            except RequestTooLarge:
                assert prompt + params.max_tokens > 64
            next_rid += 1
        elif action < 0.35 and sched.requests:
            sched.finish(rng.choice(list(sched.requests.values())))  # abort
        elif action < 0.45 and sched.requests:
            req = rng.choice(list(sched.requests.values()))
            # park on a peer / come back with new tokens, as routing does
            if req.state is State.PENDING:
                req.seq.extend([2] * rng.randint(1, 3))
                req.state = State.RUNNING if req.pages else State.WAITING
            elif req.kv_len == len(req.seq):
                req.state = State.PENDING
        else:
            for item in sched.schedule():
                req = item.req
                assert len(req.pages) * alloc.page_size >= req.kv_len + item.num_tokens
                req.kv_len += item.num_tokens
                if item.completes:
                    req.seq.append(3)
                    if req.num_output >= req.params.max_tokens:
                        sched.finish(req)
        sched.check_integrity()
    for req in list(sched.requests.values()):
        sched.finish(req)
    sched.check_integrity()
    assert alloc.num_free == alloc.num_pages


def test_requests_growing_side_by_side_keep_one_run_each() -> None:
    """Eight requests decoding in lockstep to 40 pages each, in a pool with room: every
    page table is one contiguous run (the CPU attention then reads views, not copies)."""
    alloc = PageAllocator(num_pages=1024, page_size=4)
    sched = Scheduler(alloc, EngineSettings(max_batch_tokens=64, max_batch_size=8), 256)
    for rid in range(8):
        sched.add(Request(rid, [1] * 5, 5, SamplingParams(max_tokens=155), arrival=rid))
    for _ in range(155):
        for item in sched.schedule():
            item.req.kv_len += item.num_tokens
            item.req.seq.append(3)
    for req in sched.requests.values():
        assert len(req.pages) == 40
        assert req.pages == list(range(req.pages[0], req.pages[0] + 40)), req.pages
