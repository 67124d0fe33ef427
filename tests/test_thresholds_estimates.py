"""Live estimates of routing and step latency feeding the threshold model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trd.batching import LatencyStats, RoutingStats, spec_from_stats, throughput


def test_routing_frequencies_and_tokens_are_exact() -> None:
    stats = RoutingStats(m=3, window=100)
    for src, dst, tokens in [(0, 0, 1), (0, 0, 1), (0, 1, 0), (0, 1, 2), (1, 0, 1)]:
        stats.record(src, dst, tokens)
    np.testing.assert_array_equal(stats.p(), [[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    # Model 2 has no data: it keeps its requests and commits one token per step.
    np.testing.assert_array_equal(stats.c(), [[1, 1, 1], [1, 1, 1], [1, 1, 1]])


def test_routing_tokens_average_per_transition() -> None:
    stats = RoutingStats(m=2, window=10)
    for tokens in (0, 0, 3):
        stats.record(0, 1, tokens)
    assert stats.c()[0, 1] == 1.0
    stats.record(0, 1, 5)
    assert stats.c()[0, 1] == 2.0


def test_routing_window_forgets_the_oldest_transitions() -> None:
    stats = RoutingStats(m=2, window=3)
    stats.record(0, 1, 4)
    for _ in range(3):
        stats.record(0, 0, 1)
    np.testing.assert_array_equal(stats.p(), [[1.0, 0.0], [0.0, 1.0]])
    assert stats.c()[0, 1] == 1.0  # the evicted 4-token move no longer counts


def test_routing_rejects_unknown_models() -> None:
    with pytest.raises(ValueError, match=r"outside models 0\.\.1"):
        RoutingStats(m=2, window=3).record(0, 2, 1)


def test_latency_interpolation_is_exact_for_linear_steps() -> None:
    stats = LatencyStats(m=1, window=100)
    for batch in (2, 4, 7):
        stats.record(0, batch, (4.0 + 0.5 * batch) / 1000)
    np.testing.assert_allclose(stats.step_ms(10)[0], [4.0 + 0.5 * b for b in range(1, 11)])


def test_latency_uses_the_median_per_batch_size() -> None:
    stats = LatencyStats(m=1, window=100)
    for seconds in (0.010, 0.011, 0.500):  # one step stretched by a hiccup
        stats.record(0, 1, seconds)
    np.testing.assert_allclose(stats.step_ms(3)[0], [11.0, 11.0, 11.0])


def test_latency_extrapolation_never_falls_or_turns_negative() -> None:
    stats = LatencyStats(m=2, window=100)
    stats.record(0, 4, 0.010)
    stats.record(0, 8, 0.030)
    # Model 1 got faster with larger batches (noise): no slope downwards.
    stats.record(1, 1, 0.006)
    stats.record(1, 3, 0.005)
    table = stats.step_ms(10)
    # Slope 5 ms per request; below size 4, at least 10 ms * b / 4 (no cheaper per request).
    np.testing.assert_allclose(table[0], [2.5, 5.0, 7.5, 10, 15, 20, 25, 30, 35, 40])
    np.testing.assert_allclose(table[1][:4], [6.0, 5.5, 5.0, 5.0])


def test_latency_window_forgets_the_oldest_steps() -> None:
    stats = LatencyStats(m=1, window=2)
    for seconds in (0.100, 0.002, 0.004):
        stats.record(0, 1, seconds)
    np.testing.assert_allclose(stats.step_ms(1)[0], [3.0])


def test_latency_table_needs_every_model() -> None:
    stats = LatencyStats(m=2, window=2)
    stats.record(0, 1, 0.002)
    with pytest.raises(ValueError, match="model 1 has no latency observations"):
        stats.step_ms(4)


def test_snapshots_round_trip_through_json() -> None:
    routing = RoutingStats(m=2, window=3)
    latency = LatencyStats(m=2, window=5)
    for src, dst, tokens in [(0, 1, 1), (1, 0, 0), (0, 0, 1), (0, 1, 1)]:
        routing.record(src, dst, tokens)
    for model, batch, seconds in [(0, 1, 0.006), (0, 2, 0.007), (1, 1, 0.028)]:
        latency.record(model, batch, seconds)
    routing2 = RoutingStats.from_dict(json.loads(json.dumps(routing.to_dict())))
    latency2 = LatencyStats.from_dict(json.loads(json.dumps(latency.to_dict())))
    np.testing.assert_array_equal(routing2.p(), routing.p())
    np.testing.assert_array_equal(routing2.c(), routing.c())
    np.testing.assert_array_equal(latency2.step_ms(4), latency.step_ms(4))
    assert routing2.to_dict() == routing.to_dict()


def test_spec_from_stats_feeds_the_model() -> None:
    routing = RoutingStats(m=2, window=100)
    for _ in range(13):
        routing.record(0, 0, 1)
    for _ in range(7):
        routing.record(0, 1, 1)
    for _ in range(7):
        routing.record(1, 0, 1)
    latency = LatencyStats(m=2, window=100)
    latency.record(0, 1, 0.006)
    latency.record(1, 1, 0.0279)
    spec = spec_from_stats(routing, latency, n=3, delta_ms=0.1)
    np.testing.assert_allclose(spec.p, [[0.65, 0.35], [1.0, 0.0]])
    np.testing.assert_allclose(spec.step_ms, [[6.0] * 3, [27.9] * 3])
    assert throughput(spec, 1, [1, 1]) == pytest.approx(1000 * 1.35 / (6.0 + 0.35 * 27.9))
    with pytest.raises(ValueError, match="routing has 2 models, latency 3"):
        spec_from_stats(routing, LatencyStats(m=3, window=1), n=3, delta_ms=0.1)
