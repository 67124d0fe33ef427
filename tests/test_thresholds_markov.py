"""The Markov throughput model on cases whose answer can be worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from trd.batching import (
    SearchResult,
    SystemSpec,
    candidates,
    recommend,
    search,
    throughput,
    to_table,
)


def spec(
    p: list[list[float]], step_ms: list[list[float]], c: list[list[float]] | None = None
) -> SystemSpec:
    m = len(p)
    tokens = np.ones((m, m)) if c is None else np.array(c)
    return SystemSpec(p=np.array(p), c=tokens, step_ms=np.array(step_ms), delta_ms=0.1)


def test_single_request_single_model_makes_one_token_per_step() -> None:
    assert throughput(spec([[1.0]], [[7.3]]), 1, [1]) == pytest.approx(1000 / 7.3, rel=1e-12)


def test_single_model_runs_every_request_in_one_batch() -> None:
    # Thresholds 1..3 all end up batching the three requests together.
    for b in (1, 2, 3):
        assert throughput(spec([[1.0]], [[5.0, 6.0, 7.0]]), 3, [b]) == pytest.approx(3000 / 7.0)


def test_latency_rounds_up_to_whole_quanta_without_float_noise() -> None:
    # 1.1 / 0.1 is 11.000000000000002 in floats: still 11 quanta. 1.05 rounds up to 11.
    assert throughput(spec([[1.0]], [[1.1]]), 1, [1]) == pytest.approx(1000 / 1.1)
    assert throughput(spec([[1.0]], [[1.05]]), 1, [1]) == pytest.approx(1000 / 1.1)


def test_one_request_alternating_models_follows_the_routing_chain() -> None:
    # Stationary visits (1/1.35, 0.35/1.35); committed tokens c: large->small drops its token.
    s = spec([[0.65, 0.35], [1.0, 0.0]], [[6.0], [27.9]], c=[[1, 1], [0, 1]])
    per_visit_ms = (6.0 + 0.35 * 27.9) / 1.35
    tokens_per_visit = (0.65 + 0.35) / 1.35
    assert throughput(s, 1, [1, 1]) == pytest.approx(1000 * tokens_per_visit / per_visit_ms)


def test_identity_routing_never_uses_the_second_model() -> None:
    s = spec([[1.0, 0.0], [0.0, 1.0]], [[4.0, 5.0, 6.0], [9.0, 9.0, 9.0]])
    assert throughput(s, 3, [1, 1]) == pytest.approx(3000 / 6.0)
    assert throughput(s, 3, [1, 3]) == pytest.approx(3000 / 6.0)


def test_start_up_states_are_transient() -> None:
    # Everyone leaves model 0 after one step and stays on model 1: only model 1 counts.
    s = spec([[0.0, 1.0], [0.0, 1.0]], [[4.0, 4.0], [3.0, 8.0]])
    assert throughput(s, 2, [1, 1]) == pytest.approx(2000 / 8.0)
    assert throughput(s, 2, [1, 2]) == pytest.approx(2000 / 8.0)


def test_several_closed_classes_weigh_by_where_the_start_leads() -> None:
    # Models 1 and 2 keep what they get: the two requests split once, then stay.
    s = spec(
        [[0.0, 0.5, 0.5], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
        [[1.0, 1.0], [2.0, 3.0], [5.0, 8.0]],
    )
    both_on_1, both_on_2 = 2000 / 3.0, 2000 / 8.0
    split = 1000 / 2.0 + 1000 / 5.0
    expected = 0.25 * both_on_1 + 0.25 * both_on_2 + 0.5 * split
    assert throughput(s, 2, [1, 1, 1]) == pytest.approx(expected)


def test_slowly_mixing_chain_still_finds_the_stationary_law() -> None:
    # Switching is so rare that power iteration cannot converge; pi = (0.75, 0.25).
    s = spec([[1 - 1e-7, 1e-7], [3e-7, 1 - 3e-7]], [[2.0], [5.0]])
    assert throughput(s, 1, [1, 1]) == pytest.approx(1000 / (0.75 * 2.0 + 0.25 * 5.0), rel=1e-6)


def test_requests_moving_in_lock_step_never_wait_on_a_threshold() -> None:
    # Both requests start together and always go 0 -> 1 -> 0: 4 tokens per 11 ms.
    s = spec([[0.0, 1.0], [1.0, 0.0]], [[1.0, 1.0], [10.0, 10.0]])
    assert throughput(s, 2, [1, 1]) == pytest.approx(4000 / 11.0)
    assert throughput(s, 2, [1, 2]) == pytest.approx(4000 / 11.0)


def test_thresholds_that_can_deadlock_are_rejected_naming_the_rule() -> None:
    s = spec([[0.5, 0.5], [0.5, 0.5]], [[1.0] * 4, [2.0] * 4])
    with pytest.raises(ValueError, match=r"sum_i\(B_i - 1\) < N = 4"):
        throughput(s, 4, [3, 3])
    with pytest.raises(ValueError, match="need 2 thresholds"):
        throughput(s, 4, [1])
    with pytest.raises(ValueError, match=">= 1"):
        throughput(s, 4, [0, 1])
    with pytest.raises(ValueError, match=r"n must be in 1\.\.4"):
        throughput(s, 5, [1, 1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"p": [[0.5, 0.5]]}, "square"),
        ({"c": [[1.0]]}, "shape of p"),
        ({"p": [[0.5, 0.4], [0.0, 1.0]]}, "sum to 1"),
        ({"p": [[1.5, -0.5], [0.0, 1.0]]}, "non-negative"),
        ({"c": [[1.0, -1.0], [1.0, 1.0]]}, "c must be non-negative"),
        ({"step_ms": [[1.0, 2.0]]}, r"shape \(2, max_n\)"),
        ({"step_ms": [[1.0], [0.0]]}, "positive"),
        ({"step_ms": [[1.0], [np.nan]]}, "finite"),
        ({"delta_ms": 0.0}, "delta_ms"),
    ],
)
def test_spec_validation(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "p": [[0.5, 0.5], [0.0, 1.0]],
        "c": [[1.0, 1.0], [1.0, 1.0]],
        "step_ms": [[1.0], [2.0]],
        "delta_ms": 0.1,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        SystemSpec(**args)  # type: ignore[arg-type]


def test_candidates_enumerate_valid_thresholds_in_order() -> None:
    assert list(candidates(2, 2)) == [(1, 1), (1, 2), (2, 1)]
    assert list(candidates(3, 3, fixed={0: 1})) == [
        (1, 1, 1),
        (1, 1, 2),
        (1, 1, 3),
        (1, 2, 1),
        (1, 2, 2),
        (1, 3, 1),
    ]
    with pytest.raises(ValueError, match="fixed threshold 5"):
        list(candidates(2, 2, fixed={5: 1}))


def test_search_keeps_the_lowest_thresholds_among_ties() -> None:
    # Model 1 is never visited, so every candidate gives the same throughput.
    s = spec([[1.0, 0.0], [0.0, 1.0]], [[4.0, 5.0], [9.0, 9.0]])
    result = search(s, 2)
    assert result.thresholds == (1, 1)
    assert [b for b, _ in result.curve] == [(1, 1), (1, 2), (2, 1)]
    assert result.tokens_per_s == pytest.approx(2000 / 5.0)


def test_recommend_and_table_for_r2r_figures() -> None:
    s = spec([[0.65, 0.35], [1.0, 0.0]], [[6.0] * 4, [27.9] * 4])
    results = recommend(s, [2, 4], fixed={0: 1})
    assert {n: r.thresholds for n, r in results.items()} == {2: (1, 2), 4: (1, 3)}
    # n = 1 has no result (all 1); n = 3 reuses n = 2's thresholds.
    assert to_table(results, 2) == [[1, 1, 1, 1], [1, 2, 2, 3]]


def test_r2r_figures_up_to_eight_requests() -> None:
    """R2R's figures (35% of tokens to the large model, which hands back after one; 6.0
    and 27.9 ms steps; the small model never waits): one request makes 1.35 tokens per
    6 + 0.35 * 27.9 ms; the large model's best threshold grows with the requests, and
    waiting for a batch beats running at once from 2 requests on."""
    s = spec([[0.65, 0.35], [1.0, 0.0]], [[6.0] * 8, [27.9] * 8])
    results = recommend(s, range(1, 9), fixed={0: 1})
    assert results[1].tokens_per_s == pytest.approx(1000 * 1.35 / (6.0 + 0.35 * 27.9))
    assert to_table(results, 2) == [[1] * 8, [1, 2, 2, 3, 4, 4, 5, 5]]
    for n in range(2, 9):
        curve = dict(results[n].curve)
        assert curve[results[n].thresholds] > curve[(1, 1)], n
    rates = [results[n].tokens_per_s for n in range(1, 9)]
    assert rates == sorted(rates)


def test_table_rejects_results_of_another_model_count() -> None:
    result = SearchResult(n=1, thresholds=(1, 1), tokens_per_s=1.0, curve=[])
    with pytest.raises(ValueError, match="expected 3"):
        to_table({1: result}, 3)
    with pytest.raises(ValueError, match="no search results"):
        to_table({}, 3)
