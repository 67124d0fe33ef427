"""Sampling: seeded reproducibility independent of the batch, filters, stop conditions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trd.engines.engine import Engine
from trd.engines.sampler import sample
from trd.engines.spec import EngineSpec
from trd.protocol import FinishReason, SamplingParams
from trd.rng import uniform

PROMPT = [101, 102, 103, 104]


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]) -> Engine:
    return Engine(EngineSpec.of(tiny_models["small"], kv_tokens=8192))


def test_seeded_sampling_is_identical_alone_and_in_a_batch_of_8(engine: Engine) -> None:
    params = SamplingParams(max_tokens=32, temperature=0.9, top_p=0.95, top_k=50, seed=1234)
    alone = engine.generate([PROMPT], params)[0]
    others = [
        SamplingParams(max_tokens=40, temperature=1.0, seed=s, ignore_eos=True) for s in range(7)
    ]
    rids = [engine.add_request([200 + i, 201 + i], p) for i, p in enumerate(others[:3])]
    rid = engine.add_request(PROMPT, params)
    rids += [engine.add_request([300 + i], p) for i, p in enumerate(others[3:])]
    got: list[int] = []
    while engine.has_unfinished():
        got += [o.token for o in engine.step() if o.rid == rid]
    assert len(rids) == 7
    assert got == alone
    different_seed = engine.generate(
        [PROMPT], SamplingParams(max_tokens=32, temperature=0.9, seed=9)
    )
    assert different_seed[0] != alone


def test_top_k_one_and_tiny_top_p_are_greedy(engine: Engine) -> None:
    greedy = engine.generate([PROMPT], SamplingParams(max_tokens=16))[0]
    top_k = engine.generate([PROMPT], SamplingParams(max_tokens=16, temperature=1.5, top_k=1))
    top_p = engine.generate([PROMPT], SamplingParams(max_tokens=16, temperature=1.5, top_p=1e-6))
    assert top_k[0] == greedy and top_p[0] == greedy


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_top_p_below_the_dtype_s_smallest_number_keeps_the_top_token(dtype: torch.dtype) -> None:
    # 5e-324 (float64's smallest) is 0 in these dtypes; nothing was kept and the gather crashed.
    logits = torch.tensor([[0.1, 2.0, 0.3], [1.0, 0.0, 0.5]], dtype=dtype)
    params = [SamplingParams(temperature=1.0, top_p=5e-324, seed=s) for s in (1, 2)]
    assert sample(logits, params, [0, 0]) == [1, 0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_tiny_temperature_on_half_precision_logits_is_greedy(dtype: torch.dtype) -> None:
    # 9.5 / 1e-4 overflows float16 (max 65504) to inf and softmax makes NaN of it; the
    # sampling math runs in float32, where the top token takes all the probability.
    logits = torch.tensor([[3.0, 9.5, -2.0, 9.25]], dtype=dtype).repeat(8, 1)
    params = [SamplingParams(temperature=1e-4, seed=s) for s in range(8)]
    assert sample(logits, params, list(range(8))) == [1] * 8


@pytest.mark.parametrize(
    ("probs", "temperature", "top_p"),
    [
        ([0.5, 0.3, 0.15, 0.05], 1.0, 1.0),
        ([0.5, 0.3, 0.15, 0.05], 0.5, 1.0),
        ([0.7, 0.2, 0.1], 2.0, 1.0),
        # the nucleus: 0.5 + 0.3 < 0.9 <= 0.5 + 0.3 + 0.15 keeps three tokens
        ([0.5, 0.3, 0.15, 0.05], 1.0, 0.9),
    ],
)
def test_sampling_frequencies_follow_the_distribution(
    probs: list[float], temperature: float, top_p: float
) -> None:
    """Pearson's chi-squared against p ** (1/T) normalised over the top_p nucleus: below
    the 1e-6 quantile; tokens outside the nucleus never drawn."""
    n = 6000
    logits = torch.log(torch.tensor([probs], dtype=torch.float64))
    counts = [0] * len(probs)
    params = [SamplingParams(temperature=temperature, top_p=top_p, seed=5)]
    for pos in range(n):
        counts[sample(logits, params, [pos])[0]] += 1
    tempered = torch.softmax(logits[0] / temperature, dim=-1).tolist()
    kept = len(tempered) if top_p == 1.0 else 3
    assert sum(counts[kept:]) == 0, counts
    nucleus = [p / sum(tempered[:kept]) for p in tempered[:kept]]
    chi2 = sum((c - n * p) ** 2 / (n * p) for c, p in zip(counts, nucleus, strict=False))
    critical = {3: 30.66, 2: 27.63}[kept - 1]  # chi-squared quantile 1 - 1e-6, df 3 / 2
    assert chi2 < critical, (counts, [round(n * p) for p in nucleus])


def test_top_k_and_top_p_never_pick_filtered_tokens() -> None:
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]] * 2, dtype=torch.float64))
    params = [
        SamplingParams(temperature=1.0, top_k=2, seed=1),
        SamplingParams(temperature=1.0, top_p=0.65, seed=2),
    ]
    seen: list[set[int]] = [set(), set()]
    for pos in range(500):
        a, b = sample(logits, params, [pos, pos])
        seen[0].add(a)
        seen[1].add(b)
    assert seen == [{0, 1}, {0, 1}]


def test_uniform_depends_only_on_seed_and_position() -> None:
    assert uniform(3, 10) == uniform(3, 10)
    assert len({uniform(3, p) for p in range(1000)}) == 1000
    assert all(0.0 <= uniform(s, p) < 1.0 for s in range(20) for p in range(50))


def test_stop_token_and_max_tokens(engine: Engine) -> None:
    greedy = engine.generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    stop_at = greedy[5]
    first = greedy.index(stop_at)
    rid = engine.add_request(PROMPT, SamplingParams(max_tokens=12, stop_token_ids=(stop_at,)))
    outs = []
    while engine.has_unfinished():
        outs += [o for o in engine.step() if o.rid == rid]
    assert [o.token for o in outs] == greedy[: first + 1]
    assert outs[-1].finish is FinishReason.STOP
    assert len(greedy) == 12


def test_bad_requests_are_rejected(engine: Engine) -> None:
    with pytest.raises(ValueError, match="at least one token"):
        engine.add_request([])
    with pytest.raises(ValueError, match="out of range"):
        engine.add_request([5, 999999])
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        SamplingParams(max_tokens=0)
