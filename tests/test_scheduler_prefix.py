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


def make(num_pages: int, budget: int = 64, schedule: str = "lpm") -> Scheduler:
    settings = EngineSettings(max_batch_tokens=budget, max_batch_size=8, schedule=schedule)
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


def test_lpm_lets_the_request_with_the_longest_cached_prefix_take_the_first_free_place() -> None:
    # a finished conversation turn (blocks 0-3 cached), a decoding request that holds KV,
    # then two newcomers: the older shares nothing, the newer continues the turn
    for schedule, first in (("lpm", 3), ("fcfs", 2)):
        sched = make(32, budget=24, schedule=schedule)
        sched.finish(prefilled(sched, list(range(17))))
        holder = prefilled(sched, list(range(50, 53)), rid=1)
        fresh = req(2, list(range(100, 120)))
        turn = req(3, [*range(17), 0, *range(200, 206)])  # 24 tokens, 16 of them cached
        for r in (fresh, turn):
            sched.add(r)
        assert sched.order() == ([holder, turn, fresh] if first == 3 else [holder, fresh, turn])
        fed = run(sched)
        assert fed[0] == (1, 1)  # the holder keeps its place ahead of both
        # the turn feeds only its 8 new tokens, the newcomer what the budget leaves
        assert fed[1:] == ([(3, 8), (2, 15)] if first == 3 else [(2, 20), (3, 3)])


def test_lpm_preempts_by_age_so_an_older_request_still_progresses() -> None:
    sched = make(6, budget=64)
    sched.finish(prefilled(sched, list(range(16))))  # blocks 0-3 cached
    old = req(1, list(range(100, 117)))  # needs 5 pages, shares nothing
    young = req(2, [*range(16), 1])  # 4 of its 5 blocks cached
    sched.add(old)
    sched.add(young)
    assert sched.order() == [young, old]
    assert run(sched) == [(2, 1)]  # the young one fits on its cached blocks; old waits
    # next step the young one holds KV, so the older comes first again and preempts it
    assert run(sched) == [(1, 17)] and sched.preemptions == 1
