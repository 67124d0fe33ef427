"""`tokenrouterd eval routing`'s arithmetic and options: where refined sweep points go, the
equal-share table, the curves and prompt sets it may run (the sweep itself runs engine
processes: docs/quality.md has a run)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from trd.bench.chat_prompts import CHAT_PROMPTS
from trd.evals.routing import main as eval_routing
from trd.evals.routing.judging import judging_prompts
from trd.evals.routing.report import at_share, table
from trd.evals.routing.sweep import Point, refinements
from trd.routers import data
from trd.routers.prompts import TRAIN_CHAT_PROMPTS, prompts


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


def test_curves_are_chosen_by_name(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """Only the named curves are built; the untrained heads are written only when swept."""
    pos = data.teacher_force(tiny_models["small"], [[5, 6, 7]], [[10, 11, 12]])
    ns = argparse.Namespace(heads=tmp_path / "no-heads", out=tmp_path / "out")
    built = eval_routing.curves(ns, pos, [0.5], frozenset({"entropy", "glimp"}))
    assert [c[0] for c in built] == ["entropy rule", "glimp"]
    assert not (tmp_path / "out" / "random").exists()
    built = eval_routing.curves(ns, pos, [0.5], frozenset({"entropy", "random"}))
    assert [c[0] for c in built] == ["entropy rule", "random citer", "random r2r", "random collm"]
    assert sorted(f.name for f in (tmp_path / "out" / "random").iterdir()) == [
        "citer.safetensors", "collm.safetensors", "r2r.safetensors"]  # fmt: skip
    pair = ["--small", str(tiny_models["small"]), "--large", str(tiny_models["large"])]
    args = eval_routing.parse_args([*pair, "--heads", str(tmp_path), "--out", "x",
                                    "--curves", "entropy,r2r"])  # fmt: skip
    assert args.curves == "entropy,r2r"
    with pytest.raises(SystemExit):
        eval_routing.parse_args([*pair, "--heads", str(tmp_path), "--out", "x",
                                 "--curves", "entropy,cider"])  # fmt: skip


def test_the_written_set_judges_only_heads_not_trained_on_it(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """96 prompts: the bench's 32 and the 64 chat training prompts, refused for heads
    trained on those and for training."""
    ps = judging_prompts("written", tiny_models["small"], 1000)
    assert len(ps) == len({tuple(p) for p in ps}) == len(CHAT_PROMPTS) + len(TRAIN_CHAT_PROMPTS)
    with pytest.raises(ValueError, match="judge heads"):
        prompts("written", tiny_models["small"], 4)
    pair = ["--small", str(tiny_models["small"]), "--large", str(tiny_models["large"])]
    argv = [*pair, "--heads", str(tmp_path), "--out", "x", "--prompts", "written"]
    (tmp_path / "training.json").write_text(json.dumps({"prompt_source": "magpie"}))
    assert eval_routing.parse_args(argv).prompts == "written"
    (tmp_path / "training.json").write_text(json.dumps({"prompt_source": "chat"}))
    with pytest.raises(SystemExit):
        eval_routing.parse_args(argv)
