"""A run's summary from its records: throughput, latency summaries, the token-model columns.

    requests, failed, duration_s, prompt_tokens, output_tokens
    request_throughput (completed requests / s), output_throughput (tokens / s)
    ttft_ms, tpot_ms, itl_ms, e2el_ms        each {"mean", "p50", "p90", "p99"} (`stats`)
    large_share      output tokens of the server's last model (in its tokens_per_model
                     order: the config's, largest last) / all output tokens
    tokens_per_model, handoffs_per_request
    identity         a digest of every request's (prompt, token ids, producers): equal
                     for two runs exactly when they gave the same outputs to the same
                     prompts
    prompt_set       a digest of the prompts served: runs compare only on equal sets

The token-model columns are None unless every completed request carried the producers
(our daemon with return_token_ids); they are never guessed from text.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from trd.bench.record import Record
from trd.bench.stats import summary


def digest_set(items: Iterable[str]) -> str:
    """The name of a set of digests (order does not matter)."""
    return hashlib.sha1(",".join(sorted(items)).encode()).hexdigest()[:16]


def token_models(done: Sequence[Record]) -> dict[str, Any]:
    """large_share, tokens_per_model, handoffs_per_request, identity: None without producers."""
    empty = dict.fromkeys(("large_model", "large_share", "tokens_per_model",
                           "handoffs_per_request", "identity"))  # fmt: skip
    if not done or any(r.models is None or not r.tokens_per_model for r in done):
        return empty
    counts: Counter[str] = Counter()
    for r in done:
        counts.update(r.models or [])
    names = list(done[0].tokens_per_model or {})
    total = sum(counts.values())
    large = names[-1]
    return {
        "large_model": large,
        "large_share": counts[large] / total if total else 0.0,
        "tokens_per_model": {n: counts[n] for n in names},
        "handoffs_per_request": sum(r.handoffs or 0 for r in done) / len(done),
        "identity": digest_set(f"{r.conversation}:{r.turn}:{r.prompt}:{r.output}" for r in done),
    }


def summarize(records: Sequence[Record], wall: float) -> dict[str, Any]:
    done = [r for r in records if r.ok]
    tokens = sum(r.output_tokens for r in done)
    prompt = [r.prompt_tokens for r in done if r.prompt_tokens is not None]
    return {
        "requests": len(records), "failed": len(records) - len(done), "duration_s": wall,
        "prompt_tokens": sum(prompt) if len(prompt) == len(done) else None,
        "output_tokens": tokens,
        "request_throughput": len(done) / wall if wall else None,
        "output_throughput": tokens / wall if wall else None,
        "ttft_ms": summary((r.ttft for r in done if r.ttft is not None), 1e3),
        "tpot_ms": summary((t for r in done if (t := r.tpot) is not None), 1e3),
        "itl_ms": summary((x for r in done for x in r.itl), 1e3),
        "e2el_ms": summary((r.latency for r in done if r.latency is not None), 1e3),
        "prompt_set": digest_set(r.prompt for r in records),
        **token_models(done),
        "first_error": next((r.error for r in records if r.error), None),
    }  # fmt: skip
