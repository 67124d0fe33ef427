"""Exhaustive search of delayed-batching thresholds with the Markov model.

The daemon keeps thresholds as one list per model indexed by the active
request count n (DESIGN.md section 5): B_i = table[i][min(n, len) - 1].
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from trd.batching.markov import throughput
from trd.batching.spec import SystemSpec

# Throughputs closer than this (relative) are a tie; the earlier candidate, with
# lower thresholds and so less waiting per request, wins.
_TIE = 1e-9


@dataclass(frozen=True)
class SearchResult:
    """Best thresholds for one request count, and every candidate's throughput."""

    n: int
    thresholds: tuple[int, ...]
    tokens_per_s: float
    curve: list[tuple[tuple[int, ...], float]]


def candidates(m: int, n: int, fixed: dict[int, int] | None = None) -> Iterator[tuple[int, ...]]:
    """All B with B_i >= 1 and sum_i(B_i - 1) < n, in lexicographic order.

    fixed pins some models (e.g. {0: 1}: the entry model never waits).
    """
    fixed = fixed or {}
    for i, pinned in fixed.items():
        if not 0 <= i < m or pinned < 1:
            raise ValueError(f"fixed threshold {i}: {pinned} needs 0 <= model < {m} and B >= 1")
    ranges = [[fixed[i]] if i in fixed else range(1, n + 1) for i in range(m)]
    for b in itertools.product(*ranges):
        if sum(x - 1 for x in b) < n:
            yield b


def search(spec: SystemSpec, n: int, fixed: dict[int, int] | None = None) -> SearchResult:
    """Evaluate every valid threshold vector for n requests and keep the best."""
    curve = [(b, throughput(spec, n, b)) for b in candidates(spec.m, n, fixed)]
    if not curve:
        raise ValueError(f"no thresholds with sum_i(B_i - 1) < {n} match fixed {fixed}")
    best, best_t = curve[0]
    for b, t in curve[1:]:
        if t > best_t * (1 + _TIE):
            best, best_t = b, t
    return SearchResult(n=n, thresholds=best, tokens_per_s=best_t, curve=curve)


def recommend(
    spec: SystemSpec, n_values: Iterable[int], fixed: dict[int, int] | None = None
) -> dict[int, SearchResult]:
    """search() for each request count in n_values."""
    return {n: search(spec, n, fixed) for n in n_values}


def to_table(results: dict[int, SearchResult], m: int) -> list[list[int]]:
    """Per-model threshold lists for n = 1..max(results): table[i][n - 1] = B_i.

    A count without a result takes the best of the nearest smaller count, which
    stays valid (sum_i(B_i - 1) < n' < n); below every result all B_i are 1.
    """
    if not results:
        raise ValueError("no search results to tabulate")
    table: list[list[int]] = [[] for _ in range(m)]
    current = (1,) * m
    for n in range(1, max(results) + 1):
        if n in results:
            current = results[n].thresholds
            if len(current) != m:
                raise ValueError(f"result for n={n} has {len(current)} thresholds, expected {m}")
        for i in range(m):
            table[i].append(current[i])
    return table
