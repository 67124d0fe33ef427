"""Live rates for `trctl status`: tokens/s and handoffs/s per engine from Stats counters."""

from __future__ import annotations

import pytest

from trd.supervisor.rates import RATE_WINDOW_S, Rates


def stats(**engines: tuple[int, int]) -> dict[str, dict[str, int]]:
    return {n: {"tokens_committed": t, "handoffs_out": h} for n, (t, h) in engines.items()}


def test_rates_over_the_window_per_engine_even_one_that_reported_late() -> None:
    rates = Rates()
    rates.sample(stats(small=(0, 0)), now=0.0)
    rates.sample(stats(small=(50, 5), large=(10, 0)), now=1.0)
    rates.sample(stats(small=(100, 10), large=(30, 2)), now=2.0)
    assert rates.per_second() == {"small": (50.0, 5.0), "large": (20.0, 2.0)}


def test_old_samples_leave_the_window_and_a_restart_starts_over() -> None:
    rates = Rates()
    rates.sample(stats(small=(0, 0)), now=0.0)
    rates.sample(stats(small=(1000, 0)), now=RATE_WINDOW_S)
    assert rates.per_second()["small"][0] == pytest.approx(1000 / RATE_WINDOW_S)
    rates.sample(stats(small=(1010, 0)), now=RATE_WINDOW_S + 1)  # drops the sample at 0
    assert rates.per_second()["small"][0] == pytest.approx(10.0)
    rates.sample(stats(small=(5, 0)), now=RATE_WINDOW_S + 2)  # counters began again
    assert rates.per_second() == {}
