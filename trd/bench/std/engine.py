"""The standard server's engine: tokenrouterd's single-model Engine, its profile timed.

Each call is a new one-token request carrying its full context. With the prefix cache
on (the engine's own, `trd/engines/prefix_cache.py`, as vLLM's automatic prefix
caching) a call goes

    admit    the request as usual
    match    its full blocks' keys against the cache (at most len - 1 tokens, whole
             blocks), and a reference on the matched pages: it starts with kv_len =
             matched tokens (the scheduler would do this at its first step; done here,
             at admission, to time it)
    forward  only seq[kv_len:]
    insert   the computed full blocks into the cache
    unlock   finish: its pages are released, the KV stays cached

With the cache off (`engine.prefix_cache: false`) the engine is the stateless server:
every call prefills its whole context into fresh pages that are freed at the end.
"""

from __future__ import annotations

from collections.abc import Sequence

from trd.bench.std.phases import Profile
from trd.engines.engine import Engine
from trd.engines.request import Request
from trd.engines.spec import EngineSpec
from trd.protocol import FinishReason, SamplingParams


class StdEngine(Engine):
    def __init__(self, spec: EngineSpec, *, profile: Profile) -> None:
        super().__init__(spec)
        self.profile = profile
        self.cache = self.scheduler.cache

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
            self.scheduler.match(req)
        self.profile.cached_tokens += req.kv_len
        return rid

    def commit(self, req: Request, tokens: Sequence[int]) -> FinishReason:
        if self.cache is not None:
            with self.profile.time("insert"):
                self.scheduler.cache_computed(req)
        with self.profile.time("unlock"):
            return super().commit(req, tokens)
