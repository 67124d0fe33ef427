"""The engines' prefix cache alone: hits, misses, eviction order, references.

Every test checks the cache's invariants after each operation; the randomized test
also writes a fake "KV" (the prefix a page was computed for) into each page and checks
that every matched page holds exactly the prefix the request asked for, which fails
if a referenced page were ever handed out again.
"""

from __future__ import annotations

import random

import pytest

from trd.engines.pages import OutOfPages
from trd.engines.prefix_cache import PrefixCache

PS = 4  # page size in these tests


def tables(*pages: list[int]) -> dict[int, list[int]]:
    """Live page tables by request id, as the scheduler passes them."""
    return dict(enumerate(pages))


def run_request(cache: PrefixCache, tokens: list[int]) -> tuple[list[int], int]:
    """One call the way the server makes it: match, lock, allocate, insert, release.

    Returns (the request's page table, matched tokens)."""
    keys = cache.block_keys(tokens)
    hit = cache.match(keys[: (len(tokens) - 1) // PS])
    cache.acquire(hit)
    cache.check_integrity(tables(hit))
    pages = hit + cache.allocate(0, -(-len(tokens) // PS) - len(hit), hit[-1] if hit else None)
    cache.check_integrity(tables(pages))
    cache.insert(keys, pages)
    cache.check_integrity(tables(pages))
    cache.free(0, pages)
    cache.check_integrity(tables())
    return pages, len(hit) * PS


def test_block_keys_cover_full_blocks_and_chain_the_prefix() -> None:
    cache = PrefixCache(num_pages=8, page_size=PS)
    keys = cache.block_keys(list(range(10)))  # 2 full blocks, 2 tokens left over
    assert [k[1] for k in keys] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    # The same block after a different first block is a different key.
    other = cache.block_keys([9, 9, 9, 9, 4, 5, 6, 7])
    assert other[1][1] == keys[1][1] and other[1] != keys[1]
    # Extending known keys gives the keys computed from scratch.
    assert cache.block_keys(list(range(13)), keys) == cache.block_keys(list(range(13)))


def test_miss_then_hit_then_partial_block_is_not_cached() -> None:
    cache = PrefixCache(num_pages=8, page_size=PS)
    pages, hit = run_request(cache, list(range(10)))  # blocks 0, 1 full; block 2 partial
    assert (pages, hit) == ([0, 1, 2], 0)
    assert cache.num_cached == 2  # the partial third page went back to the empty list
    pages, hit = run_request(cache, list(range(11)))
    assert (pages[:2], hit) == ([0, 1], 8)  # both full blocks reused, tail recomputed


def test_partial_prefix_match_stops_at_the_first_different_block() -> None:
    cache = PrefixCache(num_pages=8, page_size=PS)
    run_request(cache, list(range(13)))  # blocks 0, 1, 2 cached in pages 0, 1, 2
    fork = [*range(8), 99, 99, 99, 99, 12]
    pages, hit = run_request(cache, fork)
    assert hit == 8 and pages[:2] == [0, 1] and pages[2] not in (0, 1, 2)
    assert cache.match(cache.block_keys(list(range(12)))) == [0, 1, 2]  # old branch kept


def test_full_hit_recomputes_the_last_block_into_a_fresh_page() -> None:
    cache = PrefixCache(num_pages=8, page_size=PS)
    first, _ = run_request(cache, list(range(8)))
    again, hit = run_request(cache, list(range(8)))  # all 8 tokens cached: feed >= 1
    assert hit == 4 and again[0] == first[0] and again[1] != first[1]
    # The recomputed block was cached already in page first[1]: the copy stays uncached.
    assert cache.num_cached == 2
    assert cache.match(cache.block_keys(list(range(8)))) == first


def test_eviction_is_lru_by_release_and_tail_first_within_a_release() -> None:
    cache = PrefixCache(num_pages=4, page_size=PS)
    a, _ = run_request(cache, list(range(8)))  # pages 0, 1: released tail first
    b, _ = run_request(cache, list(range(100, 108)))  # pages 2, 3
    assert (a, b) == ([0, 1], [2, 3]) and cache.num_free == 4
    assert cache.allocate(0, 1) == [1]  # a's tail: the oldest release, queued before its head
    cache.check_integrity(tables([1]))
    assert cache.match(cache.block_keys(list(range(8)))) == [0]
    assert cache.allocate(0, 2) == [0, 3]  # then a's head, then b's tail
    assert cache.match(cache.block_keys(list(range(100, 108)))) == [2]
    assert cache.counters.evictions == 3
    cache.check_integrity(tables([1], [0, 3]))


def test_a_growing_request_evicts_the_block_after_its_run_first() -> None:
    """With no empty page left, a request that grows takes the cached page right after
    its last one, out of LRU order: its table stays one run, read without a copy."""
    cache = PrefixCache(num_pages=4, page_size=PS)
    run_request(cache, list(range(8)))  # pages 0, 1 cached (the oldest release)
    run_request(cache, list(range(100, 108)))  # pages 2, 3 cached
    grower = cache.allocate(0, 2)  # evicts the two oldest blocks: pages 0 and 1
    assert grower == [0, 1] and cache.counters.evictions == 2
    assert cache.allocate(0, 1, after=grower[-1]) == [2]  # not page 3, b's tail (older)
    assert cache.match(cache.block_keys(list(range(100, 108)))) == []  # b's head is gone
    assert cache.num_evictable == 1 and cache.counters.evictions == 3
    cache.check_integrity(tables([0, 1, 2]))


def test_a_hit_refreshes_recency() -> None:
    cache = PrefixCache(num_pages=4, page_size=PS)
    run_request(cache, [*range(4), 0])  # block in page 0
    run_request(cache, [*range(100, 104), 0])  # block in page 2 (page 3 tail)
    run_request(cache, list(range(5)))  # hits page 0 again: now the newest release
    # empty pages 1 and 3 and the LRU block's page 2 (evicted: empty), handed out as a run
    assert cache.allocate(0, 3) == [1, 2, 3]
    assert cache.match(cache.block_keys(list(range(4)))) == [0]


def test_referenced_pages_are_never_evicted_and_the_budget_holds() -> None:
    cache = PrefixCache(num_pages=3, page_size=PS)
    run_request(cache, [*range(8), 0])  # pages 0, 1 cached, page 2 empty again
    held = cache.match(cache.block_keys(list(range(8))))
    cache.acquire(held)
    assert cache.num_free == 1
    assert cache.allocate(0, 1) == [2]
    with pytest.raises(OutOfPages, match="asked for 1 pages, 0 free or evictable"):
        cache.allocate(0, 1)
    cache.check_integrity(tables(held, [2]))
    assert cache.num_cached == 2  # nothing was evicted to serve the failed call
    cache.free(0, held)
    assert cache.allocate(0, 2) == [0, 1]  # both evicted, then handed out as one run
    cache.check_integrity(tables([2], [0, 1]))
    assert cache.num_cached == 0


def test_two_requests_sharing_pages_count_two_references() -> None:
    cache = PrefixCache(num_pages=6, page_size=PS)
    run_request(cache, list(range(9)))
    keys = cache.block_keys(list(range(9)))
    x, y = cache.match(keys), cache.match(keys)
    cache.acquire(x)
    cache.acquire(y)
    assert cache.refs[:2] == [2, 2]
    cache.check_integrity(tables(x, y))
    cache.free(0, x)
    assert cache.allocate(0, 4) == [2, 3, 4, 5]  # still referenced by y: not evictable
    with pytest.raises(AssertionError, match="disagree"):
        cache.check_integrity(tables(x, y))


def test_misuse_is_caught() -> None:
    cache = PrefixCache(num_pages=2, page_size=PS)
    with pytest.raises(AssertionError, match="no reference held"):
        cache.free(0, [0])
    with pytest.raises(AssertionError, match="holds no cached block"):
        cache.acquire([0])
    with pytest.raises(AssertionError, match="without a reference"):
        cache.insert(cache.block_keys([1, 2, 3, 4]), [0])
    with pytest.raises(ValueError, match="2 block keys for 1 pages"):
        cache.insert(cache.block_keys(list(range(8))), cache.allocate(0, 1))
    with pytest.raises(ValueError, match="num_pages, page_size >= 1"):
        PrefixCache(num_pages=0, page_size=PS)


@pytest.mark.parametrize("seed", range(4))
def test_randomized_requests_always_match_their_own_prefix(seed: int) -> None:
    """Concurrent requests over a small vocabulary (many shared prefixes), tight budget."""
    rng = random.Random(seed)
    cache = PrefixCache(num_pages=12, page_size=PS)
    content: dict[int, tuple[int, ...]] = {}  # page -> the prefix its "KV" was computed for
    live: list[tuple[list[int], list[int]]] = []  # (tokens, page table)
    for _ in range(400):
        if live and (rng.random() < 0.5 or cache.num_free < 5):  # a call needs <= 5
            tokens, pages = live.pop(rng.randrange(len(live)))
            for i, page in enumerate(pages):  # nobody overwrote a page we hold
                assert content[page] == tuple(tokens[: min(len(tokens), (i + 1) * PS)])
            cache.free(0, pages)
        else:
            base = [rng.randrange(2) for _ in range(rng.randrange(1, 5) * PS)]
            tokens = [*base[: rng.randrange(1, len(base) + 1)], rng.randrange(3)]
            keys = cache.block_keys(tokens)
            hit = cache.match(keys[: (len(tokens) - 1) // PS])
            for i, page in enumerate(hit):
                assert content[page] == tuple(tokens[: (i + 1) * PS])
            cache.acquire(hit)
            need = -(-len(tokens) // PS) - len(hit)
            pages = hit + cache.allocate(0, need, hit[-1] if hit else None)
            for i in range(len(hit), len(pages)):  # compute the uncached suffix
                content[pages[i]] = tuple(tokens[: min(len(tokens), (i + 1) * PS)])
            cache.insert(keys, pages)
            live.append((tokens, pages))
        cache.check_integrity(tables(*(p for _, p in live)))
        held = {page for _, pages in live for page in pages}
        assert len(held) + cache.num_free == cache.num_pages  # the budget, seen from outside
    assert cache.counters.evictions > 0
