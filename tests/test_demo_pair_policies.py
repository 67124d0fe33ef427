"""The real demo pair (Qwen2.5-Coder 0.5B + 1.5B) routed by every policy, four requests in
flight, token for token against the reference loop (slow tier).

test_demo_daemon checks `tokenrouterd --demo` as a user runs it (bfloat16, R-Stitch). Here
the pair is served in float32 from a config, once per policy, and four chat requests run
at once, greedy: each answer's tokens and the model of each must be the reference loop's
(float32 on both sides; the learned gates with seeded untrained heads sized for the 0.5B,
whose scores straddle their 0.5 threshold). The references are computed first, with the
models loaded once, and freed before any daemon starts: the two copies of the pair never
share the memory.
"""

from __future__ import annotations

import gc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from trd.demo.pair import DemoPair, ensure_demo_pair
from trd.frontend.tokens import PromptEncoder
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.testing.reference import ReferenceRouter

from daemon_fixture import REPO_ROOT, Daemon, launch_daemon, wait_serving, write_config
from routing_cases import random_heads

pytestmark = [pytest.mark.timeout(3600), pytest.mark.demo_pair, pytest.mark.slow]
QUESTIONS = [
    "What is the capital of France?",
    "Explain what a hash map is in two sentences.",
    "Write a Python function that reverses a string.",
    "Name three prime numbers.",
]
MAX_TOKENS = 24
NAMES = ["small", "large"]
Answer = tuple[list[int], list[str]]  # token ids, the model of each


@pytest.fixture(scope="module")
def pair() -> DemoPair:
    return ensure_demo_pair("qwen", REPO_ROOT / ".cache")


@pytest.fixture(scope="module")
def policies(pair: DemoPair, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    heads = random_heads(tmp_path_factory.mktemp("demo_heads"), pair.models["small"])
    gate = {name: {"head": str(path), "threshold": 0.5} for name, path in heads.items()}
    return {
        "rstitch": {"threshold": pair.threshold},
        **gate,
        "glimp": {"threshold": 1.0, "step_tokens": 8},
        "ensemble": {"weights": [0.5, 0.5], "seed": 1},
    }


@pytest.fixture(scope="module")
def expected(pair: DemoPair, policies: dict[str, dict]) -> dict[str, list[Answer]]:
    encoder = PromptEncoder(pair.models["small"])
    prompts = [encoder.chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    paths = [pair.models[n] for n in NAMES]
    base = ReferenceRouter(paths, PolicySpec("scripted", {"schedule": [0]}), "float32")
    out = {}
    for name, params in policies.items():
        ref = base.with_policy(PolicySpec(name, params))
        traces = [ref.run(p, SamplingParams(max_tokens=MAX_TOKENS)) for p in prompts]
        out[name] = [(t.tokens, [NAMES[m] for m in t.models]) for t in traces]
    del base, ref
    gc.collect()
    return out


def ask(d: Daemon, question: str) -> Answer:
    r = d.client(timeout=600).chat.completions.create(
        model=d.model, messages=[{"role": "user", "content": question}], max_tokens=MAX_TOKENS,
        temperature=0, extra_body={"return_token_ids": True},
    )  # fmt: skip
    extra: dict[str, Any] = r.choices[0].model_extra or {}
    return list(extra["token_ids"]), list(extra["token_models"])


@pytest.mark.parametrize("policy", ["rstitch", "citer", "r2r", "collm", "glimp", "ensemble"])
def test_four_answers_at_once_are_the_reference_loops(
    pair: DemoPair, policies: dict[str, dict], expected: dict[str, list[Answer]],
    tmp_path: Path, policy: str,
) -> None:  # fmt: skip
    want = expected[policy]
    assert {m for _, models in want for m in models} == set(NAMES), "both models must write"
    config = write_config(tmp_path, pair.models, NAMES, "float32",
                          policy={"name": policy, **policies[policy]},
                          max_model_len=pair.max_model_len,
                          memory={"max_kv_tokens": 4096}, engine={"threads": 1})  # fmt: skip
    d = wait_serving(launch_daemon(config), timeout=600)  # 8 GB of float32 weights
    try:
        with ThreadPoolExecutor(len(QUESTIONS)) as pool:
            got = list(pool.map(lambda q: ask(d, q), QUESTIONS))
    finally:
        assert d.stop() == 0, d.log()
    assert got == want
