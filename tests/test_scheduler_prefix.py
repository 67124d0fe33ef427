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


def ahead(rid: int, tokens: list[int]) -> Request:
    """A prefill ahead of request `rid` (trd/engines/inbox.py)."""
    r = req(rid, tokens)
    r.prefill_only = True
    return r


def test_a_prefill_ahead_feeds_whole_blocks_samples_nothing_and_leaves_them_cached() -> None:
    sched = make(8)
    a = ahead(0, list(range(10)))
    sched.add(a)
    (item,) = sched.schedule()
    assert (item.num_tokens, item.completes) == (8, False)  # 2 whole blocks of 4; no sample
    a.kv_len += item.num_tokens
    assert sched.schedule() == [] and 0 not in sched.requests  # done: finished
    cache = cache_of(sched)
    assert (cache.num_cached, cache.num_free) == (2, 8)
    assert (cache.counters.queried_tokens, cache.counters.hit_tokens) == (0, 0)
    sched.add(req(1, list(range(10))))
    assert run(sched) == [(1, 2)]  # its request, arriving later, feeds only the rest
    assert (cache.counters.queried_tokens, cache.counters.hit_tokens) == (10, 8)


def test_a_prefill_ahead_ranks_last_and_is_dropped_not_preempted_for_pages() -> None:
    settings = EngineSettings(max_batch_tokens=8, max_batch_size=8)
    sched = Scheduler(PrefixCache(4, PS), settings, max_model_len=64)
    a = ahead(0, list(range(100, 113)))  # 12 tokens to feed, 8 a step
    sched.add(a)
    assert run(sched) == [(0, 8)]
    b, c = req(1, list(range(11))), req(2, list(range(50, 53)))
    sched.add(b)
    sched.add(c)
    assert run(sched) == [(1, 8)]  # b first although a is older; the budget is spent
    # b's third page and c's are a's 2: a is dropped, not preempted, its 2 computed blocks
    # cached, then evicted for them.
    assert run(sched) == [(1, 3), (2, 3)]
    assert 0 not in sched.requests and a.state is State.FINISHED
    assert sched.preemptions == 0 and cache_of(sched).counters.evictions == 2


def test_an_adopted_prefill_ahead_counts_its_lookup_and_takes_the_entry_params() -> None:
    sched = make(8)
    sched.finish(prefilled(sched, list(range(10))))
    cache = cache_of(sched)
    before = (cache.counters.queried_tokens, cache.counters.hit_tokens)
    a = ahead(1, list(range(14)))
    sched.add(a)
    assert run(sched) == [(1, 4)]  # 8 matched, 4 fed: its third block
    assert (cache.counters.queried_tokens, cache.counters.hit_tokens) == before
    seeded = SamplingParams(max_tokens=4, temperature=0.7, seed=7)
    sched.adopt(a, seeded)
    assert not a.prefill_only and a.params is seeded
    counts = (cache.counters.queried_tokens, cache.counters.hit_tokens)
    assert counts == (before[0] + 14, before[1] + 8)
    assert run(sched) == [(1, 2)] and len(a.seq) == 15  # to the end now, and it samples
