"""The scheduler with the prefix cache as its allocator: exact pages, counts, evictions.

The model is stubbed out (`run` advances kv_len and commits a token), so each test
states exactly which pages a request gets, what it matched and what was evicted.
"""

from __future__ import annotations

from trd.engines.prefix_cache import PrefixCache
from trd.engines.request import Request, State
from trd.engines.scheduler import Scheduler
from trd.engines.spec import EngineSettings
from trd.protocol import SamplingParams

PS = 4


def make(num_pages: int) -> Scheduler:
    settings = EngineSettings(max_batch_tokens=64, max_batch_size=8)
    return Scheduler(PrefixCache(num_pages, PS), settings, max_model_len=64)


def req(rid: int, tokens: list[int]) -> Request:
    return Request(rid, list(tokens), len(tokens), SamplingParams(max_tokens=1), rid)


def run(sched: Scheduler) -> list[tuple[int, int]]:
    """One step: (rid, tokens fed) per scheduled request; completed feeds commit token 0."""
    out = []
    for item in sched.schedule():
        out.append((item.req.rid, item.num_tokens))
        item.req.kv_len += item.num_tokens
        if item.completes:
            item.req.seq.append(0)
    sched.check_integrity()
    return out


def prefilled(sched: Scheduler, tokens: list[int], rid: int = 0) -> Request:
    """A request added and run one step (its prompt fed, one token committed)."""
    r = req(rid, tokens)
    sched.add(r)
    run(sched)
    return r


def cache_of(sched: Scheduler) -> PrefixCache:
    assert sched.cache is not None
    return sched.cache


def test_a_finished_requests_blocks_serve_the_next_request() -> None:
    sched = make(8)
    a = req(0, list(range(10)))
    sched.add(a)
    assert run(sched) == [(0, 10)]
    assert a.pages == [0, 1, 2]
    sched.finish(a)
    cache = cache_of(sched)
    assert (cache.num_cached, cache.num_evictable, cache.num_free) == (2, 2, 8)
    b = req(1, [*range(10), 7, 7])
    sched.add(b)
    assert run(sched) == [(1, 4)]  # blocks 0, 1 matched: only tokens 8..11 are fed
    assert b.pages == [0, 1, 2] and b.kv_len == 12
    assert (cache.counters.queried_tokens, cache.counters.hit_tokens) == (10 + 12, 8)
    assert cache.refs[:3] == [1, 1, 1] and cache.num_evictable == 0


def test_a_running_requests_blocks_are_shared_and_never_written_by_the_sharer() -> None:
    sched = make(8)
    a = req(0, list(range(9)))
    sched.add(a)
    assert run(sched) == [(0, 9)]
    b = req(1, [*range(8), 5])  # same two blocks, another last token
    sched.add(b)
    assert run(sched) == [(0, 1), (1, 1)]  # a's blocks were cached at this schedule
    assert a.pages == [0, 1, 2] and b.pages[:2] == [0, 1] and b.pages[2] not in a.pages
    assert cache_of(sched).refs[:2] == [2, 2]
    sched.finish(a)
    sched.finish(b)
    assert cache_of(sched).num_free == 8 and sched.preemptions == 0


def test_a_full_hit_still_feeds_its_last_block_into_a_page_of_its_own() -> None:
    sched = make(8)
    a = prefilled(sched, list(range(8)))
    sched.finish(a)
    b = req(1, list(range(8)))
    sched.add(b)
    assert run(sched) == [(1, 4)]  # block 1 is cached, yet recomputed: 1 token must be fed
    assert b.pages[0] == 0 and b.pages[1] not in (0, 1)


def test_cached_pages_are_evicted_lru_tail_first_before_any_preemption() -> None:
    sched = make(4)
    a = prefilled(sched, list(range(8)))
    sched.finish(a)  # pages 0, 1 cached; page 2 (the output token's) empty again
    b = req(1, list(range(100, 115)))  # 15 tokens + 1: four pages
    sched.add(b)
    assert run(sched) == [(1, 15)]
    # a's blocks are evicted (the pool has too few empty pages) and the four pages, all
    # empty now, make one run: in LRU order they came back as [2, 3, 1, 0], gathered
    assert b.pages == [0, 1, 2, 3]
    cache = cache_of(sched)
    assert (cache.counters.evictions, cache.num_cached, sched.preemptions) == (2, 0, 0)


def test_a_pending_requests_pages_are_not_evictable_and_a_newcomer_waits() -> None:
    sched = make(4)
    a = prefilled(sched, list(range(9)))
    a.state = State.PENDING  # handed to a peer: keeps its pages
    sched.cache_computed(a)  # what the router does when it leaves
    cache = cache_of(sched)
    assert (cache.num_cached, cache.num_free) == (2, 1)
    b = req(1, list(range(100, 109)))  # needs 3 pages: a's are referenced
    sched.add(b)
    assert run(sched) == [] and b.pages == [] and sched.preemptions == 0
    sched.finish(a)  # back from the peer and done: its blocks become evictable
    assert run(sched) == [(1, 9)]
    assert b.pages == [1, 2, 3]  # the LRU block (a's tail) evicted, then one run
    assert cache.counters.evictions == 1 and cache.num_cached == 1


def test_a_preempted_request_rematches_its_own_blocks() -> None:
    sched = make(16)
    a = prefilled(sched, list(range(9)))
    sched.preempt(a)
    assert (a.kv_len, a.pages, a.state) == (0, [], State.WAITING)
    assert run(sched) == [(0, 2)]  # blocks 0, 1 are back from the cache; 8, 9 fed
    assert a.pages[:2] == [0, 1]
    cache = cache_of(sched)
    assert (cache.counters.queried_tokens, cache.counters.hit_tokens) == (9 + 10, 8)
