"""Live engine windows -> Markov recommendation, in the form the engines consume."""

from __future__ import annotations

from typing import Any

import pytest

from trd.batching.live import current_table, estimates, recommend_live


def engine_stats() -> dict[int, dict[str, Any]]:
    # Small: 6 ms steps, 35% of forwards escalate (drop, 0 tokens); large: 27.9 ms,
    # always returns with its token. These are the R2R figures of the paper.
    small = {
        "thresholds": [1],
        "window": {
            "latency": [[b, 0.006] for b in (1, 2, 4, 8) for _ in range(5)],
            "routes": [[1, 0]] * 35 + [[0, 1]] * 65,
        },
    }
    large = {
        "thresholds": [1, 1, 2],
        "window": {
            "latency": [[b, 0.0279] for b in (1, 2, 4, 8) for _ in range(5)],
            "routes": [[0, 1]] * 50,
        },
    }
    return {0: small, 1: large}


def test_estimates_recover_routing_and_latency() -> None:
    routing, latency = estimates(engine_stats())
    assert routing.p().ravel().tolist() == pytest.approx([0.65, 0.35, 1.0, 0.0])
    assert routing.c().ravel().tolist() == pytest.approx([1.0, 0.0, 1.0, 1.0])
    assert latency.step_ms(4).ravel().tolist() == pytest.approx([6.0] * 4 + [27.9] * 4)


def test_current_table_expands_the_last_entry() -> None:
    assert current_table(engine_stats(), 4) == [[1, 1, 1, 1], [1, 1, 2, 2]]


def test_recommendation_matches_the_paper_figures() -> None:
    out = recommend_live(engine_stats(), levels=(1, 2, 3, 4), delta_ms=0.1)
    best = {row["n"]: row["recommended"] for row in out["levels"]}
    # the simulation-checked optimum for these figures (tests/test_thresholds_sim.py)
    assert best == {1: [1, 1], 2: [1, 2], 3: [1, 2], 4: [1, 3]}
    assert out["table"] == [[1, 1, 1, 1], [1, 2, 2, 3]]
    for row in out["levels"]:
        assert row["predicted_tok_s"] >= row["current_predicted_tok_s"]
