"""Where a standard server's time goes, per phase of a call, as the paper profiles SGLang.

(Not named profile.py: a script run from this folder would shadow the standard library's.)

    http_json  decode the JSON body, encode the response (in the aiohttp handler; the
               HTTP parsing and writing aiohttp does around the handler are not in it)
    admit      validate the prompt and queue the request in the engine
    match      hash the prompt's full blocks, look up the longest cached prefix, take
               references on the matched pages (SGLang's match and lock)
    forward    the batched forward over the uncached suffixes, sampling, entropy
    insert     cache the request's full blocks after its forward
    unlock     release the request's page references (finish)

Totals are seconds summed over calls (forward: over batches, since one forward serves
many calls). Shares are of the sum of the phases, not of wall time: time the event loop
spends idle or in aiohttp's own parsing and writing is not in any phase.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

PHASES = ("http_json", "admit", "match", "forward", "insert", "unlock")


class Profile:
    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.calls = 0
        self.prompt_tokens = 0  # tokens the callers sent
        self.cached_tokens = 0  # of those, served from the prefix cache
        self.forwards = 0  # batches run
        self.fed_tokens = 0  # tokens those batches fed (the uncached suffixes)

    @contextmanager
    def time(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - start

    def snapshot(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "forwards": self.forwards,
            "fed_tokens": self.fed_tokens,
            "seconds": dict(self.seconds),
            "shares": shares(self.seconds),
        }


def shares(seconds: Mapping[str, float]) -> dict[str, float]:
    total = sum(seconds.values())
    return {k: v / total if total else 0.0 for k, v in seconds.items()}


def delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The profile of what happened between two snapshots of one server."""
    seconds = {k: after["seconds"][k] - before["seconds"].get(k, 0.0) for k in after["seconds"]}
    keys = ("calls", "prompt_tokens", "cached_tokens", "forwards", "fed_tokens")
    counts = {k: after[k] - before[k] for k in keys}
    return {**counts, "seconds": seconds, "shares": shares(seconds)}
