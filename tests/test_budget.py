"""A request's own share control (trd/policies/budget.py): exact thresholds."""

from __future__ import annotations

import math

import pytest

from trd.policies.budget import GAIN_TOKENS, may_stay, remember, share_tau

SCORES = [0.1 * i for i in range(1, 11)]  # ten earlier decisions, sorted


@pytest.mark.parametrize(
    ("share", "made", "large", "tau"),
    [
        (0.2, 9, 2, SCORES[7]),  # on budget: p = 0.2, the 8th of 10: the top two escalate
        (0.2, 14, 2, SCORES[5]),  # one token behind: p = 0.2 + 1/4 = 0.45, the top four
        (0.2, 4, 2, math.inf),  # 1.0 token ahead: p = 0.2 - 1/4 < 0, nothing escalates
        (0.5, 29, 10, -math.inf),  # 5 tokens behind: p >= 1, every position escalates
    ],
)
def test_the_threshold_is_the_quantile_the_deficit_asks_for(
    share: float, made: int, large: int, tau: float
) -> None:
    assert share_tau(SCORES, share, made, large) == tau


def test_no_history_no_escalation_and_the_gain() -> None:
    assert share_tau([], 0.9, 100, 0) == math.inf  # the first decision: nothing to rank
    # A deficit of GAIN_TOKENS moves p by 1: from 0 to the whole range
    assert share_tau(SCORES, 0.01, math.ceil(GAIN_TOKENS / 0.01) - 1, 0) == -math.inf


def test_the_last_model_stays_while_one_more_token_fits() -> None:
    assert may_stay(0.25, made=14, large=2)  # then 4 of 16
    assert not may_stay(0.25, made=13, large=2)  # 4 of 15 > 0.25
    assert not may_stay(0.1, made=0, large=0)  # a short request: 2 of 2


def test_scores_stay_sorted() -> None:
    scores: list[float] = []
    for x in (0.5, 0.1, 0.9, 0.5, 0.0):
        remember(scores, x)
    assert scores == [0.0, 0.1, 0.5, 0.5, 0.9]
