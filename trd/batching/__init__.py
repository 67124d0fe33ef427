"""Delayed-batching thresholds: the Markov throughput model and its live inputs."""

from __future__ import annotations

from trd.batching.estimates import LatencyStats, RoutingStats, spec_from_stats
from trd.batching.markov import check_thresholds, throughput
from trd.batching.search import SearchResult, candidates, recommend, search, to_table
from trd.batching.spec import SystemSpec

__all__ = [
    "LatencyStats",
    "RoutingStats",
    "SearchResult",
    "SystemSpec",
    "candidates",
    "check_thresholds",
    "recommend",
    "search",
    "spec_from_stats",
    "throughput",
    "to_table",
]
