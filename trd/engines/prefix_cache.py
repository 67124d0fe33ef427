"""The prefix cache over an engine's KV pages: full blocks shared by reference count.

Pure Python, no torch. One page holds one block of `page_size` tokens. A FULL block
is named by a hash chain, key_i = (hash(key_{i-1}), tokens of block i), so a key
stands for the whole prefix up to the end of its block; a partial block is never
cached (the request that writes it holds it alone). Every page is in exactly one of
three states:

    referenced  ref > 0: some request's page table lists it; never evicted
    evictable   ref = 0, holds a cached block: kept in LRU order until a page is needed
    empty       ref = 0, no block

    keys:   {k0: 3, k1: 7}                 page 3 holds block 0 of some prefix, 7 its block 1
    refs:   [0, 0, 1, 0, 0, 0, 0, 0]       page 2 is in use by one request
    lru:    3, 7   (oldest first)          evictable, evicted from the left
    empty:  0, 1, 4, 5, 6

It is the scheduler's page allocator (`allocate`, `free`, `num_free` as `PageAllocator`'s)
plus `match`/`acquire`/`insert`. A request that holds no KV here matches its longest run
of cached keys and takes a reference on those pages (its kv_len jumps to their end: the
forward feeds only the rest); it gets fresh pages for the rest, its full blocks are
inserted once their KV is computed, and `free` at its end drops its references: its
blocks stay cached. Empty pages are handed out as `PageAllocator` hands them out (a
request's next page follows its last when free), so a table stays one contiguous run
that the CPU attention reads without a copy. The cache lives inside the pool the memory
plan sized: a cached page stays until an allocation finds too few empty pages, then
evictable pages go and become empty pages, so the allocation still comes out as runs:
first those that continue the requester's run (a growing request keeps one contiguous
table), then the least recently released. Within one release the last block is queued
first, so a prefix's tail is evicted before its head (vLLM frees a request's blocks in
reverse for the same reason: a head block is shared by more prefixes).

Why a hash chain and not a radix tree (SGLang's): with pages of `page_size` tokens only
whole blocks can be shared either way, and a request's sequence grows a token at a time,
so a dict lookup per block does what a tree walk would, with less to keep consistent
(no node splits, no parent links to update on eviction). Keys compare the block's tokens
exactly; the parent is named by its 64-bit hash, the risk vLLM takes with its builtin
hash mode.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trd.engines.pages import OutOfPages, PageAllocator

BlockKey = tuple[int, tuple[int, ...]]  # (hash of the parent block's key, block tokens)
ROOT = 0  # parent hash of a sequence's first block
IN_USE = 0  # the empty-page allocator's one owner: every page that is not empty


@dataclass
class CacheCounters:
    queried_tokens: int = 0  # tokens of the requests that looked up a prefix (vLLM's queries)
    hit_tokens: int = 0  # of those, served from cached pages
    evictions: int = 0  # cached blocks dropped to reuse their page


class PrefixCache:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"need num_pages, page_size >= 1; got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self.refs = [0] * num_pages
        self._page_of: dict[BlockKey, int] = {}
        self._key_of: dict[int, BlockKey] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # evictable pages, oldest first
        self._empty = PageAllocator(num_pages, page_size)  # its free pages are the empty ones
        self.counters = CacheCounters()

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    # -- keys ------------------------------------------------------------------------
    def block_keys(self, tokens: Sequence[int], known: Sequence[BlockKey] = ()) -> list[BlockKey]:
        """Keys of every full block of `tokens`, extending `known` (the keys of its start)."""
        keys = list(known)
        parent = hash(keys[-1]) if keys else ROOT
        ps = self.page_size
        for start in range(len(keys) * ps, len(tokens) - ps + 1, ps):
            key = (parent, tuple(tokens[start : start + ps]))
            keys.append(key)
            parent = hash(key)
        return keys

    # -- the request path ------------------------------------------------------------
    def match(self, keys: Sequence[BlockKey]) -> list[int]:
        """Pages of the longest cached run of `keys` from the first block on."""
        pages = []
        for key in keys:
            page = self._page_of.get(key)
            if page is None:
                break
            pages.append(page)
        return pages

    def acquire(self, pages: Iterable[int]) -> None:
        """Take a reference on cached pages (a match): they can no longer be evicted."""
        for page in pages:
            if page not in self._key_of:
                raise AssertionError(f"page {page} is acquired but holds no cached block")
            if self.refs[page] == 0:
                del self._lru[page]
            self.refs[page] += 1

    @property
    def num_free(self) -> int:
        """Pages an allocation can get: empty ones, then evictable ones."""
        return self._empty.num_free + len(self._lru)

    def allocate(self, rid: int, count: int, after: int | None = None) -> list[int]:
        """`count` pages with one reference each, from the empty pages (continuing the run
        that ends at page `after` where they can); when too few are empty, cached blocks
        are evicted and their pages become empty: those that continue the run, then the
        least recently released. (`rid` is PageAllocator's signature; pages here are
        owned by references, not by ids.)

        Evicted pages go through the empty allocator rather than straight into the page
        table, so the table still comes out as runs (handed out in LRU order, a
        request's pages came back tail first, and its KV was gathered, not viewed)."""
        if count > self.num_free:
            raise OutOfPages(
                f"asked for {count} pages, {self.num_free} free or evictable "
                f"({self.num_pages - self.num_free} referenced)"
            )
        # Eviction is due: the cached blocks right after `after` go first, so the run
        # goes on (a table read as one view is worth more than the oldest blocks kept).
        page = -1 if after is None else after + 1
        while self._empty.num_free < count and 0 <= page < self.num_pages:
            if page in self._lru:
                self._evict(page)
            elif not self._empty.is_free(page):
                break
            page += 1
        while self._empty.num_free < count:
            self._evict(next(iter(self._lru)))
        pages = self._empty.allocate(IN_USE, count, after)
        for page in pages:
            self.refs[page] = 1
        return pages

    def _evict(self, page: int) -> None:
        """Drop the block cached in an evictable page; the page becomes empty."""
        del self._lru[page]
        del self._page_of[self._key_of.pop(page)]
        self.counters.evictions += 1
        self._empty.free(IN_USE, [page])

    def insert(self, keys: Sequence[BlockKey], pages: Sequence[int]) -> int:
        """Cache block i in pages[i] for every i < len(keys); return how many are new.

        The caller holds references on `pages` and their first len(keys) blocks hold
        computed KV. A block already cached in another page (two requests computed
        it) stays uncached in this one, so each key names one page.
        """
        if len(keys) > len(pages):
            raise ValueError(f"{len(keys)} block keys for {len(pages)} pages")
        new = 0
        for key, page in zip(keys, pages, strict=False):
            if self.refs[page] == 0:
                raise AssertionError(f"page {page} inserted without a reference")
            have = self._key_of.get(page)
            if have is not None:
                if have != key:
                    raise AssertionError(f"page {page} holds another block than the one inserted")
                continue
            if key not in self._page_of:
                self._page_of[key] = page
                self._key_of[page] = key
                new += 1
        return new

    def free(self, rid: int, pages: Sequence[int]) -> None:
        """Drop one reference per page; the last block becomes evictable first."""
        for page in reversed(pages):
            if self.refs[page] <= 0:
                raise AssertionError(f"page {page} released with no reference held")
            self.refs[page] -= 1
            if self.refs[page] == 0:
                if page in self._key_of:
                    self._lru[page] = None
                else:
                    self._empty.free(IN_USE, [page])

    # -- checks ----------------------------------------------------------------------
    @property
    def num_cached(self) -> int:
        return len(self._key_of)

    @property
    def num_evictable(self) -> int:
        return len(self._lru)

    def check_integrity(self, tables: dict[int, list[int]]) -> None:
        """Every page is referenced xor evictable xor empty; keys and pages agree; each
        page's reference count is the number of live page tables (`tables`) listing it."""
        if any(self._page_of.get(k) != p for p, k in self._key_of.items()) or len(
            self._page_of
        ) != len(self._key_of):
            raise AssertionError("block keys and cached pages disagree")
        referenced = {p for p in range(self.num_pages) if self.refs[p] > 0}
        if any(r < 0 for r in self.refs):
            raise AssertionError("a page has a negative reference count")
        empty, lru = set(self._empty.free_pages()), set(self._lru)
        if empty & lru or (empty | lru) & referenced:
            raise AssertionError("a page is in two of referenced / evictable / empty")
        if len(empty) + len(lru) + len(referenced) != self.num_pages:
            raise AssertionError("pages leaked: referenced + evictable + empty != total")
        if lru != {p for p in self._key_of if self.refs[p] == 0} or empty & set(self._key_of):
            raise AssertionError("an unreferenced cached page is not evictable, or empty & cached")
        counts = [0] * self.num_pages
        for table in tables.values():
            for page in table:
                counts[page] += 1
        if counts != self.refs:
            raise AssertionError("reference counts disagree with the live page tables")
