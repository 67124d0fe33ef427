"""Summary of one run: throughput, latency percentiles, the large model's share, prompts.

`prompt_set` names the set of prompts a run served (a digest of their digests), so
two runs can be compared only when they served the same prompts.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from trd.bench.identity import digest_ids
from trd.bench.stats import percentile

from benchkit.client import Record


def pct(values: Sequence[float], q: float) -> float:
    return percentile(values, q) if values else 0.0


def prompt_set(records: Sequence[Record]) -> str:
    return digest_set(digest_ids(r.prompt) for r in records)


def digest_set(prompt_digests: Iterable[str]) -> str:
    """The name of a set of prompts, from their digests (`identity.digest_ids`)."""
    return hashlib.sha1(",".join(sorted(prompt_digests)).encode()).hexdigest()[:16]


def summarize(records: Sequence[Record], wall: float, large: str = "large") -> dict[str, Any]:
    tokens = sum(r.output_tokens for r in records)
    out: dict[str, Any] = {
        "requests": len(records),
        "prompt_set": prompt_set(records),
        "prompt_tokens_mean": float(np.mean([len(r.prompt) for r in records])) if records else 0,
        "wall_s": wall,
        "output_tokens": tokens,
        "throughput": tokens / wall,
        "large_fraction": sum(r.tokens_per_model.get(large, 0) for r in records) / max(1, tokens),
        "handoffs_per_request": sum(r.handoffs for r in records) / max(1, len(records)),
    }
    for key in ("ttft", "tpot", "latency"):
        vals = [getattr(r, key) for r in records]
        out.update({f"{key}_p{q}": pct(vals, q) for q in (50, 90, 99)})
    return out
