"""The standard server's engine with its prefix cache, on a real fixture model.

Calls are made the way the dispatcher makes them (each one a new one-token request
with the full context); the cached engine must give the stateless engine's tokens
while feeding only the uncached suffixes, and keep every page accounted for.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from trd.bench.compare import workloads
from trd.bench.std.engine import StdEngine
from trd.bench.std.phases import Profile
from trd.engines.spec import EngineSpec
from trd.protocol import SamplingParams

ONE_TOKEN = SamplingParams(max_tokens=1, ignore_eos=True)
PAGE = 16


def engine(path: Path, prefix_cache: bool, kv_tokens: int = 4096) -> StdEngine:
    spec = EngineSpec.of(path, kv_tokens=kv_tokens, page_size=PAGE, prefix_cache=prefix_cache)
    return StdEngine(spec, profile=Profile())


def call(e: StdEngine, prompts: Sequence[list[int]]) -> tuple[list[int], int]:
    """One call per prompt, all in flight together: (next token of each, tokens fed)."""
    rids = [e.add_request(p, ONE_TOKEN) for p in prompts]
    e.check_integrity()
    out: dict[int, int] = {}
    fed = 0
    while e.has_unfinished():
        result = e.forward()
        assert result is not None
        fed += result.fed
        for req, token in zip(result.requests, result.tokens, strict=True):
            e.commit(req, [token])
            out[req.rid] = token
        e.check_integrity()
    return [out[r] for r in rids], fed


def grow(e: StdEngine, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], int]:
    """Extend every prompt by its greedy token `steps` times, a call per token."""
    seqs, fed = [list(p) for p in prompts], 0
    for _ in range(steps):
        tokens, n = call(e, seqs)
        fed += n
        for seq, t in zip(seqs, tokens, strict=True):
            seq.append(t)
    return seqs, fed


@pytest.fixture(scope="module")
def prompts(tiny_models: dict[str, Path]) -> list[list[int]]:
    w = workloads.Workload("t", prompt_tokens=37, max_tokens=1, seed=5)
    return workloads.prompts(tiny_models["small"], w, 3)


def test_cached_calls_match_stateless_calls_and_feed_only_suffixes(
    tiny_models: dict[str, Path], prompts: list[list[int]]
) -> None:
    cached, plain = engine(tiny_models["small"], True), engine(tiny_models["small"], False)
    steps = 40
    got, fed = grow(cached, prompts, steps)
    want, fed_plain = grow(plain, prompts, steps)
    assert got == want
    assert fed_plain == sum(len(p) + i for p in prompts for i in range(steps))
    # Full blocks are reused, so a call feeds 1..PAGE tokens: its partial last block.
    assert fed <= sum(len(p) for p in prompts) + len(prompts) * steps * PAGE
    assert fed < fed_plain / 4
    prof = cached.profile.snapshot()
    assert prof["calls"] == len(prompts) * steps
    assert prof["cached_tokens"] == sum(len(p) + i for p in prompts for i in range(steps)) - fed
    assert all(prof["seconds"][k] > 0 for k in ("admit", "match", "insert", "unlock"))
    assert plain.profile.snapshot()["cached_tokens"] == 0
    # Pages are handed out in runs: each sequence's cached blocks lie in consecutive
    # pages though the three grew side by side (so the CPU attention reads views).
    assert cached.cache is not None
    for seq in got:
        pages = cached.cache.match(cached.cache.block_keys(seq))
        assert len(pages) == len(seq) // PAGE
        assert pages == list(range(pages[0], pages[0] + len(pages))), pages


def test_shared_prefix_full_hit_and_concurrent_requests(
    tiny_models: dict[str, Path], prompts: list[list[int]]
) -> None:
    cached, plain = engine(tiny_models["large"], True), engine(tiny_models["large"], False)
    base = prompts[0][:32]  # exactly two blocks
    batch = [base, base, [*base, 5, 6], prompts[1]]
    assert call(cached, batch)[0] == call(plain, batch)[0]
    # All of `base` is cached now: the call recomputes its last block (>= 1 token fed).
    tokens, fed = call(cached, [base])
    assert (tokens, fed) == (call(plain, [base])[0], PAGE)
    assert cached.cache is not None and cached.cache.counters.hit_tokens >= PAGE


def test_eviction_under_a_tight_page_budget_keeps_outputs(
    tiny_models: dict[str, Path], prompts: list[list[int]]
) -> None:
    # 8 pages: three requests of up to 57 tokens (4 pages each) do not fit together, so
    # cached blocks are evicted and newer requests preempted (and recomputed).
    cached = engine(tiny_models["small"], True, kv_tokens=8 * PAGE)
    plain = engine(tiny_models["small"], False)
    got, _ = grow(cached, prompts, 20)
    assert got == grow(plain, prompts, 20)[0]
    assert cached.cache is not None and cached.cache.counters.evictions > 0
