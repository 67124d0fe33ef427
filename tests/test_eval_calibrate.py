"""`tokenrouterd eval calibrate`, the project's one threshold finder: the bisection
against a share known in closed form, the one-pass estimate's rule on hand-made scores,
GlimpRouter's steps as the policy itself cuts them, and both ways on the fixture pair."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch

from trd.engines.request import Request
from trd.evals import calibrate
from trd.evals.calibrate import bisect, steps_of, threshold_for
from trd.policies.base import PolicyContext
from trd.policies.factory import make_policy
from trd.policies.params import PolicySpec
from trd.policies.steps import StepTable, token_texts
from trd.protocol import SamplingParams


def test_bisection_halves_toward_the_target_and_keeps_the_nearest_run() -> None:
    """share(tau) = 1 - tau: the target 0.3 is at 0.7, reached by halving [0, 1]."""
    asked: list[float] = []

    def share_at(tau: float) -> float:
        asked.append(tau)
        return 1 - tau

    tau, share = bisect(share_at, 0.3, 0.0, 1.0, steps=4)
    assert asked == [0.5, 0.75, 0.625, 0.6875]  # above, below, above, above the target
    assert (tau, share) == (0.6875, 0.3125)
    asked.clear()
    assert bisect(share_at, 0.3, 0.0, 1.0, steps=7, slack=0.1) == (0.75, 0.25)
    assert asked == [0.5, 0.75]  # within the slack: stop


def test_the_estimate_hands_over_the_most_uncertain_items_up_to_the_share() -> None:
    scores = np.array([0.5, 0.1, 0.3, 0.2])
    weights = np.array([10, 40, 20, 30])  # 100 tokens
    assert threshold_for(scores, weights, 0.1) == 0.5  # the 0.5 step: 10%
    assert threshold_for(scores, weights, 0.3) == 0.3  # and the 0.3 step: 30%
    assert threshold_for(scores, weights, 0.45) == 0.3  # 60% would overshoot
    assert threshold_for(scores, weights, 0.05) == 0.5  # even one step is more
    # One position each (R-Stitch): the share of positions at or above.
    assert threshold_for(np.arange(10.0), np.ones(10), 0.3) == 7.0


def test_the_estimate_and_the_bisection_on_the_fixture_pair(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    pair = ["--small", str(tiny_models["small"]), "--large", str(tiny_models["large"]),
            "--dtype", "float32", "--prompts", "code", "--num-prompts", "4",
            "--max-tokens", "12", "--share", "0.3"]  # fmt: skip
    out = tmp_path / "c.json"
    assert calibrate.main([*pair, "--estimate", "--out", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert 0 <= run["estimate"] <= 1 and "threshold" not in run
    assert calibrate.main([*pair, "--policy", "glimp", "--steps", "2", "--out", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["threshold"] in (calibrate.GLIMP_MAX_H / 2, calibrate.GLIMP_MAX_H * 3 / 4,
                                calibrate.GLIMP_MAX_H / 4)  # fmt: skip
    assert 0 <= run["share"] <= 1


def test_glimp_steps_end_at_blank_lines_or_the_step_length() -> None:
    # tokens: 0 = "a", 1 = "\n", 2 = "\n\n"; a blank line ends a step
    table = StepTable.of(["a", "\n", "\n\n"])
    assert steps_of(table, [0, 1, 1, 0, 2, 0, 0], step_tokens=512) == [(0, 3), (3, 2), (5, 2)]
    assert steps_of(table, [0, 0, 0, 0, 0], step_tokens=2) == [(0, 2), (2, 2), (4, 1)]
    assert steps_of(table, [0, 2], step_tokens=512) == [(0, 2)]  # no empty step at the end


def test_glimp_steps_are_the_policys_own(tiny_models: dict[str, Path]) -> None:
    # steps_of re-states GlimpPolicy._scan's rule for whole completions: the starts it
    # finds must be the step starts the policy walks through token by token
    folder, nl = tiny_models["small"], 201  # 201 is "\n" in the fixture tokenizer
    spec = PolicySpec("glimp", {"threshold": 1.0, "step_tokens": 4})
    policy = make_policy(spec, PolicyContext(0, 2, torch.nn.Embedding(2048, 8), folder))
    table = StepTable.of(token_texts(folder, 2048))
    rng = random.Random(0)
    for _ in range(50):
        output = [rng.choice([7, 8, 9, nl]) for _ in range(rng.randrange(1, 20))]
        req = Request(1, [5, 6], 2, SamplingParams(), 0.0)
        walked = [0]
        for token in output:
            req.seq.append(token)
            start = policy._scan(req).step_start  # type: ignore[attr-defined]
            if start != walked[-1] and start < len(output):
                walked.append(start)
        assert [start for start, _ in steps_of(table, output, step_tokens=4)] == walked
