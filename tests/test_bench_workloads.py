"""The benchmark's workloads, pair selection, plans and step costs, without serving anything
(the compare smoke run, tests/test_bench_smoke.py, is the slow tier).

The chat workload renders the written prompts through the model's own chat template,
as the daemon's /v1/chat/completions does; `--pair demo|tiny` are `trd.demo.pair`'s pairs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from trd.bench.chat_prompts import CHAT_PROMPTS
from trd.bench.compare.pairs import load_pair
from trd.bench.compare.plan import PLANS
from trd.bench.compare.runner import Bench
from trd.bench.compare.stepcost import batching_bound, step_ms
from trd.bench.compare.workloads import WORKLOADS, prompts
from trd.frontend.tokens import PromptEncoder

CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache"


def test_chat_prompts_go_through_the_template_in_a_seeded_order(
    tiny_models: dict[str, Path],
) -> None:
    folder = tiny_models["small"]
    chat = WORKLOADS["demo"]["short"]
    every = prompts(folder, chat, len(CHAT_PROMPTS))
    assert len({tuple(p) for p in every}) == len(CHAT_PROMPTS) == 32
    encoder = PromptEncoder(folder)
    rendered = {tuple(encoder.chat([{"role": "user", "content": t}])) for t in CHAT_PROMPTS}
    assert {tuple(p) for p in every} == rendered
    assert prompts(folder, chat, 5) == every[:5]  # a smaller run: a prefix
    assert prompts(folder, replace(chat, seed=2), 5) != every[:5]
    with pytest.raises(ValueError, match="has 32 prompts, 33 asked"):
        prompts(folder, chat, 33)


def test_corpus_prompts_have_the_workloads_exact_length(tiny_models: dict[str, Path]) -> None:
    short = WORKLOADS["tiny"]["short"]
    got = prompts(tiny_models["small"], short, 3)
    assert [len(p) for p in got] == [short.prompt_tokens] * 3 and len(set(map(tuple, got))) == 3


def test_the_real_tokenizer_frames_each_chat_prompt() -> None:
    from trd.testing.smollm2 import ensure_smollm2

    try:
        folder = ensure_smollm2(CACHE_DIR)
    except FileNotFoundError as exc:
        pytest.skip(f"no SmolLM2 checkpoint: {exc}")
    encoder = PromptEncoder(folder)
    start = encoder.encode("<|im_start|>system\n")
    end = encoder.encode("<|im_start|>assistant\n")
    for ids in prompts(folder, WORKLOADS["demo"]["short"], 32):
        assert ids[: len(start)] == start and ids[-len(end) :] == end


def test_pairs_are_the_demo_pairs(tiny_models: dict[str, Path]) -> None:
    pair = load_pair("tiny", CACHE_DIR)
    assert pair.models == {"small": tiny_models["small"], "large": tiny_models["large"]}
    assert pair.workloads == WORKLOADS["tiny"]
    described = pair.describe()["models"]
    assert described["large"]["layers"] > described["small"]["layers"]
    with pytest.raises(ValueError, match="'big' is not one of demo, tiny"):
        load_pair("big")


def test_the_batching_bound_is_the_cost_of_each_step() -> None:
    points = [[1, 10.0], [2, 12.0], [4, 16.0]]
    assert [step_ms(points, f) for f in (1, 3, 6)] == [10.0, 14.0, 20.0]  # 6: extended
    costs = {"m": {"decode_ms": points[:2], "prefill_ms": points[2]}}
    fed = [9, 1, 3, 6]  # tokens fed by the run's steps: the last three
    # A noisy calibration (the prefill measured below the widest decode) is made
    # monotone: never a negative cost beyond it, never less for more tokens.
    dip = [[1, 10.0], [16, 30.0], [64, 25.0]]
    assert [step_ms(dip, f) for f in (16, 40, 64, 500)] == [30.0, 30.0, 30.0, 30.0]
    before = {"m": {"steps": 7, "rows": 20, "tokens_fed": 30}}
    after = {"m": {"steps": 10, "rows": 30, "tokens_fed": 50, "window": {"fed": fed}}}
    b = batching_bound(before, after, costs, wall=0.1, kind="parallel")
    assert b["models"]["m"]["need_s"] == pytest.approx(0.044)  # 10 + 14 + 20 ms
    assert b["fraction"] == pytest.approx(0.44)
    before["m"]["steps"] = 4  # 6 steps, 4 in the window: scaled from the window's steps
    b = batching_bound(before, after, costs, wall=0.1, kind="parallel")
    assert b["models"]["m"]["need_s"] == pytest.approx(1e-3 * (26 + 10 + 14 + 20) * 6 / 4)


def test_the_pair_plan_serves_only_the_short_workload(tiny_models: dict[str, Path]) -> None:
    plan = PLANS["pair"]
    bench = Bench(plan, load_pair("tiny", CACHE_DIR), 0.5, Path("."))
    assert [(w.name, n) for w, n in bench.reference_jobs()] == [("short", 16)]
    assert plan.long == 0 and not plan.forced_delay and plan.ns == (1, 4, 16)
    # pair_long: the output lengths at N=4, the loop on those 4 prompts of each workload
    long = Bench(PLANS["pair_long"], load_pair("tiny", CACHE_DIR), 0.5, Path("."))
    assert [(w.name, n) for w, n in long.reference_jobs()] == [("short", 4), ("long@1024", 4)]
    long16 = Bench(PLANS["pair_long16"], load_pair("tiny", CACHE_DIR), 0.5, Path("."))
    jobs = [(w.name, n) for w, n in long16.reference_jobs()]
    assert jobs == [("short", 16), ("long@1024", 16)] and not PLANS["pair_long16"].std_systems
