"""The Markov model against an independent discrete-event simulation."""

from __future__ import annotations

import numpy as np
import pytest

from trd.batching import SystemSpec, candidates, search, throughput

from thresholds_sim import simulate

# R2R figures (the paper's): the small model hands 35% of tokens to the large one,
# which always hands back after one token; every token is kept. Step times do not
# depend on batch size here.
R2R_P = np.array([[0.65, 0.35], [1.0, 0.0]])
R2R_C = np.ones((2, 2))

THREE_P = np.array([[0.6, 0.25, 0.15], [0.5, 0.4, 0.1], [0.7, 0.1, 0.2]])
# Model 0 -> 2 drops its candidate token; 2 -> 1 commits two (a verified draft).
THREE_C = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 2.0, 1.0]])


def r2r_spec(n: int) -> SystemSpec:
    return SystemSpec(p=R2R_P, c=R2R_C, step_ms=np.array([[6.0] * n, [27.9] * n]), delta_ms=0.1)


def two_spec(n: int) -> SystemSpec:
    # Batch-size dependent steps; p_00 = 0.8 keeps most tokens on the small model.
    step = np.array([[2.0 + 0.3 * b for b in range(n)], [9.0 + 1.1 * b for b in range(n)]])
    return SystemSpec(p=np.array([[0.8, 0.2], [0.6, 0.4]]), c=R2R_C, step_ms=step, delta_ms=0.5)


def three_spec(n: int) -> SystemSpec:
    step = np.array(
        [
            [3.0 + 0.25 * b for b in range(n)],
            [7.0 + 0.5 * b for b in range(n)],
            [12.0 + 1.0 * b for b in range(n)],
        ]
    )
    return SystemSpec(p=THREE_P, c=THREE_C, step_ms=step, delta_ms=1.0)


def simulated(spec: SystemSpec, n: int, thresholds: tuple[int, ...], events: int) -> float:
    # The model quantises step times; the simulation runs those exact (continuous) times.
    latency = (spec.quanta()[:, :n] * spec.delta_ms).tolist()
    return simulate(spec.p, spec.c, latency, n, list(thresholds), events, seed=n)


def check(spec: SystemSpec, n: int, thresholds: tuple[int, ...], events: int) -> None:
    predicted = throughput(spec, n, thresholds)
    measured = simulated(spec, n, thresholds, events)
    print(f"n={n} B={thresholds}: model {predicted:.2f} tok/s, simulation {measured:.2f}")
    assert predicted == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize(
    ("n", "thresholds"), [(2, (1, 2)), (4, (1, 3)), (5, (2, 2)), (8, (1, 1)), (8, (1, 5))]
)
def test_two_models_match_simulation(n: int, thresholds: tuple[int, ...]) -> None:
    check(two_spec(n), n, thresholds, events=20_000)


@pytest.mark.parametrize(
    ("n", "thresholds"), [(2, (1, 1, 1)), (4, (1, 2, 2)), (6, (1, 1, 3)), (8, (2, 3, 3))]
)
def test_three_models_match_simulation(n: int, thresholds: tuple[int, ...]) -> None:
    check(three_spec(n), n, thresholds, events=20_000)


@pytest.mark.slow
@pytest.mark.parametrize("n", range(2, 9))
def test_model_matches_simulation_over_the_whole_grid(n: int) -> None:
    # Every candidate for two models; every fifth for three, to stay under 2 minutes.
    for spec, stride in ((two_spec(n), 1), (three_spec(n), 5)):
        for thresholds in list(candidates(spec.m, n))[::stride]:
            check(spec, n, thresholds, events=10_000)


def test_r2r_best_large_model_threshold_matches_simulation() -> None:
    # With B_small = 1, the best B_large beats the runner-up by more than 3% at
    # each n, far outside the ~0.5% noise of 40k simulated batches.
    best = {}
    for n in (2, 3, 4):
        result = search(r2r_spec(n), n, fixed={0: 1})
        sim = {b: simulated(r2r_spec(n), n, b, events=40_000) for b, _ in result.curve}
        for b, t in result.curve:
            print(f"n={n} B={b}: model {t:.2f} tok/s, simulation {sim[b]:.2f}")
        assert max(sim, key=sim.__getitem__) == result.thresholds
        best[n] = result.thresholds[1]
    assert best == {2: 2, 3: 2, 4: 3}
