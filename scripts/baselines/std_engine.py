"""The standard server's engine: tokenrouterd's single-model Engine plus a prefix cache.

Each call is a new one-token request carrying its full context. With the cache on
(vLLM's automatic prefix caching, `prefix_cache.py`):

    admit    the request as usual
    match    its full blocks' keys against the cache (at most len - 1 tokens: one token
             must be fed to get logits, as in vLLM; whole blocks only, so a full hit
             recomputes its last block into a fresh page and a shared page is never
             written)
    lock     the matched pages: the request starts with them and kv_len = matched tokens
    forward  only seq[kv_len:] (the scheduler allocates the pages it needs, evicting
             unreferenced cached blocks when no page is empty)
    insert   the computed full blocks, then release the pages: the KV stays cached

A request the scheduler preempts drops its references and recomputes from its first
token when it runs again (it does not match a second time). With the cache off the
engine is the stateless server: every call prefills its whole context into fresh
pages that are freed at the end.
"""

from __future__ import annotations

from collections.abc import Sequence

from trd.engines.engine import Engine
from trd.engines.pages import PageAllocator
from trd.engines.request import Request, State
from trd.engines.spec import EngineSpec
from trd.protocol import FinishReason, SamplingParams

from baselines.phases import Profile
from baselines.prefix_cache import BlockKey, PrefixCache


class CachedPages(PageAllocator):
    """The scheduler's page allocator, backed by the prefix cache's reference counts."""

    def __init__(self, cache: PrefixCache) -> None:
        # Not the base __init__: its free list and one-owner-per-page records cannot
        # describe a cached page listed in several requests' tables; the cache's
        # reference counts replace both.
        self.cache = cache
        self.num_pages, self.page_size = cache.num_pages, cache.page_size

    @property
    def num_free(self) -> int:
        return self.cache.num_free

    def allocate(self, rid: int, count: int, after: int | None = None) -> list[int]:
        return self.cache.allocate(count, after)

    def free(self, rid: int, pages: list[int]) -> None:
        self.cache.release(pages)

    def check_integrity(self, tables: dict[int, list[int]]) -> None:
        self.cache.check_integrity(tables.values())


class StdEngine(Engine):
    def __init__(self, spec: EngineSpec, *, prefix_cache: bool, profile: Profile) -> None:
        super().__init__(spec)
        self.profile = profile
        self.cache: PrefixCache | None = None
        if prefix_cache:
            pages = self.scheduler.allocator
            self.cache = PrefixCache(pages.num_pages, pages.page_size)
            self.scheduler.allocator = CachedPages(self.cache)
        self._keys: dict[int, list[BlockKey]] = {}  # rid -> keys of its full blocks so far

    def add_request(
        self,
        prompt: Sequence[int],
        params: SamplingParams | None = None,
        rid: int | None = None,
        prompt_len: int | None = None,
    ) -> int:
        with self.profile.time("admit"):
            rid = super().add_request(prompt, params, rid, prompt_len)
        self.profile.calls += 1
        self.profile.prompt_tokens += len(prompt)
        if self.cache is None:
            return rid
        req = self.scheduler.requests[rid]
        with self.profile.time("match"):
            keys = self.cache.block_keys(req.seq)
            pages = self.cache.match(keys[: (len(req.seq) - 1) // self.cache.page_size])
        with self.profile.time("lock"):
            self.cache.acquire(pages)
            req.pages = pages
            req.kv_len = len(pages) * self.cache.page_size
            req.state = State.RUNNING if pages else State.WAITING
        self._keys[rid] = keys
        self.profile.cached_tokens += req.kv_len
        return rid

    def commit(self, req: Request, tokens: Sequence[int]) -> FinishReason:
        if self.cache is not None:
            with self.profile.time("insert"):
                keys = self.cache.block_keys(req.seq[: req.kv_len], self._keys[req.rid])
                self.cache.insert(keys[: req.kv_len // self.cache.page_size], req.pages)
                self._keys[req.rid] = keys
        with self.profile.time("unlock"):
            reason = super().commit(req, tokens)
        if reason is not FinishReason.NONE:
            self._keys.pop(req.rid, None)
        return reason
