"""scripts/eval_routing.py's arithmetic: where refined sweep points go, and the equal-share
table (the sweep itself runs engine processes: docs/quality.md has a run)."""

from __future__ import annotations

import pytest

from routerkit.report import at_share, table
from routerkit.sweep import Point, refinements


def point(share: float, tau: float, nll: float = 3.0, label: str = "p") -> Point:
    return Point(label, tau, share, 0.0, 0.0, nll, 1.0, 1, 1.0)


def test_uncovered_shares_get_a_threshold_between_their_neighbours() -> None:
    pts = [point(0.05, 0.9), point(0.45, 0.5), point(0.21, 0.8)]
    # 0.2 is covered (0.21 is within 0.04); 0.1 lies between 0.05 and 0.21; 0.6 is outside.
    (tau,) = refinements(pts, [0.1, 0.2, 0.6])
    assert tau == pytest.approx(0.9 + (0.1 - 0.05) / (0.21 - 0.05) * (0.8 - 0.9))


def test_the_table_interpolates_inside_the_measured_range_only() -> None:
    pts = [point(0.1, 0.9, nll=4.0), point(0.3, 0.7, nll=3.0)]
    assert at_share([p.__dict__ for p in pts], "nll", 0.2) == pytest.approx(3.5)
    assert at_share([p.__dict__ for p in pts], "nll", 0.4) is None
    rows = [{**p.__dict__, "policy": "x"} for p in pts]
    rows.append({**point(1.0, 0.0).__dict__, "policy": "large-only"})  # not a curve
    md = table(rows, [0.2, 0.4]).splitlines()
    assert md[2] == "| x | 0.00 / 3.500 | - |"
    assert len(md) == 3
