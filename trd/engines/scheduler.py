"""Continuous batching with a token budget, admission bounded by free KV pages.

Pure Python, no torch. Each step every runnable request asks to feed
`seq[kv_len:]`; requests are taken in rank order (`rank`: priority, then oldest first)
until the token budget or the batch size is spent. A long feed is chunked (its
computed tokens catch up over several steps). Pages are allocated on demand; when they
run out, the last-ranked request that holds pages and is not in this step's batch is
preempted (its pages are freed and it will recompute from its committed sequence), so
higher-ranked requests always progress and no request's pages are ever touched by
another.

Priority is vLLM's request field with vLLM's meaning (SamplingParams.priority: lower
first, default 0), always on (vLLM needs `--scheduling-policy priority`; with every
request at 0 the order is the arrival order, as before). Its rank holds in every
engine's queue: the entry's, and a peer's that a handoff enters (a request's first
handoff to an engine is its arrival there; a later one keeps that arrival). As in
vLLM's priority policy, the order is strict: ties go by arrival, there is no aging (a
steady stream of high-priority work starves the rest), and the preemption victim is the
last-ranked page holder. Unlike vLLM, running and waiting requests share one order every
step, so a high-priority arrival takes a low-priority running request's place in the
batch at once (that one keeps its pages until they are needed, and waits).

With a prefix cache (`prefix_cache.py`, the allocator then), a request that holds no
KV here first takes the longest cached prefix of its sequence: whole blocks, at most
len(seq) - 1 tokens (one token is fed for the logits, and the page it writes is its
own), and its kv_len jumps to their end. Its computed full blocks are offered to the
cache before each forward, when it leaves its pages and when it finishes, so what a
request computed serves every later request with the same prefix. Eviction of
unreferenced cached pages comes before preemption (they are part of `num_free`).

A prefill ahead (`Request.prefill_only`) ranks below every real request: it is scheduled
after them, preempted before them (and then dropped, not recomputed), never preempts
one; it is finished, its blocks left to the cache, once it has fed its prompt's last full
block. Its lookup counts in the cache's counters only when it becomes a request (`adopt`).
"""

from __future__ import annotations

from dataclasses import dataclass

from trd.engines.pages import PageAllocator
from trd.engines.prefix_cache import PrefixCache
from trd.engines.request import Request, State
from trd.engines.spec import EngineSettings
from trd.protocol import SamplingParams


class RequestTooLarge(ValueError):
    """A request that can never fit this engine, even alone."""


@dataclass(frozen=True, slots=True)
class Scheduled:
    req: Request
    num_tokens: int  # feed seq[kv_len : kv_len + num_tokens]
    completes: bool  # the feed reaches the end of the sequence, so a token is sampled


class Scheduler:
    def __init__(
        self, allocator: PageAllocator | PrefixCache, settings: EngineSettings, max_model_len: int
    ) -> None:
        self.allocator = allocator
        self.cache = allocator if isinstance(allocator, PrefixCache) else None
        self.max_batch_tokens = settings.max_batch_tokens
        self.max_batch_size = settings.max_batch_size
        self.max_model_len = max_model_len
        self.requests: dict[int, Request] = {}  # every unfinished request this engine knows
        self.preemptions = 0

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        """Reject, with the numbers, a request that could never be served here."""
        total = prompt_len + max_tokens
        if total > self.max_model_len:
            raise RequestTooLarge(
                f"prompt ({prompt_len} tokens) + max_tokens ({max_tokens}) = {total} exceeds "
                f"the maximum context length {self.max_model_len}"
            )
        if self.allocator.pages_for(total) > self.allocator.num_pages:
            raise RequestTooLarge(
                f"{total} tokens need {self.allocator.pages_for(total)} KV pages, "
                f"the engine has {self.allocator.num_pages}"
            )

    def add(self, req: Request) -> None:
        self.check_fits(req.prompt_len, req.params.max_tokens)
        req.state = State.RUNNING if req.pages else State.WAITING
        self.requests[req.rid] = req

    def runnable(self) -> list[Request]:
        return [r for r in self.requests.values() if r.state in (State.WAITING, State.RUNNING)]

    def schedule(self) -> list[Scheduled]:
        batch: list[Scheduled] = []
        budget = self.max_batch_tokens
        in_batch: set[int] = set()
        for req in sorted(self.runnable(), key=rank):
            if budget == 0 or len(batch) == self.max_batch_size:
                break
            if req.state is State.FINISHED:
                continue  # a prefill ahead dropped for pages in this loop
            self.match(req)
            self.cache_computed(req)
            want = self.ahead_left(req) if req.prefill_only else req.num_unfed
            if want <= 0:
                self.finish(req)  # a prefill ahead whose blocks are all cached
                continue
            n = min(want, budget)
            if not self._reserve(req, req.kv_len + n, in_batch):
                break  # older requests keep their order; this one waits for pages
            req.state = State.RUNNING
            done = n == req.num_unfed and not req.prefill_only
            batch.append(Scheduled(req, n, completes=done))
            in_batch.add(req.rid)
            budget -= n
        return batch

    def _reserve(self, req: Request, num_tokens: int, in_batch: set[int]) -> bool:
        need = self.allocator.pages_for(num_tokens) - len(req.pages)
        while need > self.allocator.num_free:
            victim = self._victim(req, in_batch)
            if victim is None:
                return False
            self.preempt(victim)
        self._allocate(req, need)
        return True

    def reserve_free(self, req: Request, num_tokens: int) -> bool:
        """Pages for `num_tokens` of the request from free pages only (no preemption): a
        speculative step's proposals; False when there are too few."""
        need = self.allocator.pages_for(num_tokens) - len(req.pages)
        if need > self.allocator.num_free:
            return False
        self._allocate(req, need)
        return True

    def _allocate(self, req: Request, need: int) -> None:
        if need > 0:
            last = req.pages[-1] if req.pages else None
            req.pages.extend(self.allocator.allocate(req.rid, need, after=last))

    def match(self, req: Request) -> None:
        """A request without KV here starts from its longest cached prefix (looked up once
        per stretch without KV, so a request that waits for pages counts one query)."""
        cache = self.cache
        if cache is None or req.pages or req.looked_up:
            return
        req.looked_up = True
        usable = (len(req.seq) - 1) // cache.page_size
        if len(req.block_keys) < usable:
            req.block_keys = cache.block_keys(req.seq, req.block_keys)
        hit = cache.match(req.block_keys[:usable])
        cache.acquire(hit)
        req.pages, req.cached_blocks = hit, len(hit)
        req.kv_len = req.cache_hit = len(hit) * cache.page_size
        if not req.prefill_only:
            self._count_lookup(req)
        if hit and req.state is State.WAITING:
            req.state = State.RUNNING

    def _count_lookup(self, req: Request) -> None:
        if self.cache is not None:
            self.cache.counters.queried_tokens += len(req.seq)
            self.cache.counters.hit_tokens += req.cache_hit

    def ahead_left(self, req: Request) -> int:
        """Tokens a prefill ahead has still to feed: up to its prompt's last full block
        (a partial block is not cached, and one token is left for a sampling forward)."""
        page = self.allocator.page_size
        return (len(req.seq) - 1) // page * page - req.kv_len

    def adopt(self, req: Request, params: SamplingParams | None) -> None:
        """A prefill ahead becomes its request, whose handoff has arrived (with the entry
        engine's params: an unseeded sample's seed is fixed there)."""
        req.prefill_only = False
        if params is not None:
            req.params = params
        if req.looked_up:
            self._count_lookup(req)

    def cache_computed(self, req: Request) -> None:
        """Offer the request's computed full blocks (its kv_len) to the prefix cache."""
        cache = self.cache
        full = req.kv_len // self.allocator.page_size
        if cache is None or full <= req.cached_blocks:
            return
        if len(req.block_keys) < full:
            req.block_keys = cache.block_keys(req.seq, req.block_keys)
        cache.insert(req.block_keys[req.cached_blocks : full], req.pages[req.cached_blocks : full])
        req.cached_blocks = full

    def _victim(self, req: Request, in_batch: set[int]) -> Request | None:
        holders = [
            r
            for r in self.requests.values()
            if r.pages and r.rid not in in_batch and r is not req and rank(r) > rank(req)
        ]
        return max(holders, key=rank, default=None)

    def drop_kv(self, req: Request) -> None:
        """Free a request's pages; it recomputes its committed sequence when it runs again
        (from its longest cached prefix: its own blocks, unless they were evicted)."""
        self.release(req)
        req.kv_len = 0
        req.looked_up = False

    def preempt(self, req: Request) -> None:
        if req.prefill_only:
            self.finish(req)  # speculative work: dropped, its computed blocks cached
            return
        self.preemptions += 1
        self.drop_kv(req)
        if req.state is State.RUNNING:
            req.state = State.WAITING

    def release(self, req: Request) -> None:
        """Drop the request's pages; with the cache its computed full blocks stay there."""
        self.cache_computed(req)
        self.allocator.free(req.rid, req.pages)
        req.pages, req.cached_blocks, req.draft_kv = [], 0, 0

    def finish(self, req: Request) -> None:
        self.release(req)
        req.state = State.FINISHED
        del self.requests[req.rid]

    def check_integrity(self) -> None:
        self.allocator.check_integrity({r.rid: r.pages for r in self.requests.values()})
        for r in self.requests.values():
            r.check()
            if len(r.pages) < self.allocator.pages_for(r.kv_len):
                raise AssertionError(f"request {r.rid}: {r.kv_len} cached tokens, too few pages")


def rank(req: Request) -> tuple[bool, int, float]:
    """Scheduling order: real requests by priority (lower first), then oldest first; then
    prefills ahead in the same order."""
    return req.prefill_only, req.params.priority, req.arrival
