"""The reference loop's own rules (trd/testing/reference_rules.py, reference_sampling.py)
on hand-made logits, against the definitions they were written from: the oracle tests
compare the daemon with them, so they are checked on their own here, with no model."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from tokenizers import Tokenizer

from trd.policies.params import GlimpParams
from trd.protocol import SamplingParams
from trd.testing.reference_rules import Position, ensemble, glimp, rstitch, scripted
from trd.testing.reference_sampling import draw, splitmix64, uniform

V = 8
SURE = torch.tensor([20.0] + [0.0] * (V - 1), dtype=torch.float64)  # H about 0
UNSURE = torch.zeros(V, dtype=torch.float64)  # H = 1 (normalised), ln 8 nats


def at(model: int, logits: torch.Tensor, output: list[int], token: int = 0) -> Position:
    hidden = torch.zeros(4, dtype=torch.float64)
    return Position(model, logits, hidden, token, [1, 2, 3], output, SamplingParams())


def test_splitmix64_and_the_uniform_draw() -> None:
    assert splitmix64(0) == 0xE220A8397B1DCDAF  # SplitMix64's first output from state 0
    assert uniform(7, 3) == (splitmix64(splitmix64(7) ^ 3) >> 11) / 2**53
    draws = [uniform(1, p) for p in range(2000)]
    assert all(0 <= u < 1 for u in draws) and abs(sum(draws) / 2000 - 0.5) < 0.03


def test_draw_greedy_top_k_top_p_and_the_split_of_the_mass() -> None:
    logits = torch.tensor([0.0, math.log(3.0), -torch.inf, 1.0], dtype=torch.float64)
    assert draw(logits, SamplingParams(temperature=0.0), 0) == 1
    tied = torch.tensor([1.0, 5.0, 5.0], dtype=torch.float64)
    assert draw(tied, SamplingParams(temperature=0.0), 0) == 1  # the first of the largest
    assert draw(logits, SamplingParams(temperature=1.0, top_k=1, seed=3), 9) == 1
    assert draw(logits, SamplingParams(temperature=1.0, top_p=1e-9, seed=3), 9) == 1
    two = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64)  # p = 1/4, 3/4
    for position in range(50):
        u = uniform(5, position)
        token = draw(two, SamplingParams(temperature=1.0, seed=5), position)
        assert token == (1 if u < 0.75 else 0)  # in order of p: token 1 first
    # top_p 0.5: the mass above token 0 is 3/4 >= 0.5, so only token 1 is kept
    assert {draw(two, SamplingParams(temperature=1.0, top_p=0.5, seed=s), 0)
            for s in range(20)} == {1}  # fmt: skip


def test_rstitch_escalates_unsure_positions_and_returns_when_sure() -> None:
    two, three = rstitch(0.5, last=1), rstitch(0.5, last=2)
    assert two(at(0, UNSURE, [])) == (1, False)  # the large model regenerates it
    assert two(at(0, SURE, [])) == (0, True)
    assert two(at(1, UNSURE, [])) == (1, True)  # the last model keeps it and stays
    assert two(at(1, SURE, [])) == (0, True)  # sure again: back to the small one
    assert three(at(1, UNSURE, [])) == (2, False) and three(at(1, SURE, [])) == (0, True)


def test_owner_schedules() -> None:
    rule = scripted([0, 1, 1])
    assert rule(at(0, SURE, [])) == (1, True)  # p=0 is 0's; p=1 is 1's
    assert rule(at(0, SURE, [5])) == (1, False)  # p=1 is not 0's: dropped
    assert rule(at(1, SURE, [5, 6])) == (0, True)  # p=2 is 1's, p=3 is 0's
    only_first = ensemble([1.0, 0.0], seed=4)
    assert all(only_first(at(0, SURE, [9] * p)) == (0, True) for p in range(20))
    only_last = ensemble([0.0, 2.0], seed=4)
    assert all(only_last(at(0, SURE, [9] * p)) == (1, False) for p in range(20))


def test_glimp_steps_by_blank_lines_and_length(tokenizer_path: Path) -> None:
    tok = Tokenizer.from_file(str(tokenizer_path / "tokenizer.json"))
    word, newline, think = (tok.encode(t).ids[-1] for t in (" x", "\n", " list"))
    assert tok.decode([newline]) == "\n"
    params = GlimpParams(threshold=1.0, step_tokens=3, think_end=" list")
    rule = glimp(params, tok, last=1)
    assert rule(at(0, UNSURE, [])) == (1, False)  # a step's first token, unsure: the large
    assert rule(at(0, SURE, [])) == (0, True)
    assert rule(at(0, UNSURE, [word])) == (0, True)  # inside a step: no probe
    assert rule(at(1, SURE, [word], word)) == (1, True)  # the large model's step goes on
    assert rule(at(1, SURE, [word, word], word)) == (0, True)  # its 3rd token ends it
    assert rule(at(0, UNSURE, [word, word, word])) == (1, False)  # the next step's probe
    assert rule(at(0, SURE, [word], think)) == (1, True)  # the answer goes to the large
    assert rule(at(1, SURE, [word, think, word], word)) == (1, True)  # and stays there
    by_text = glimp(GlimpParams(threshold=1.0, step_tokens=10, think_end=" list"), tok, last=1)
    assert by_text(at(1, SURE, [word], newline)) == (1, True)  # one newline: no step end
    assert by_text(at(1, SURE, [word, newline], newline)) == (0, True)  # a blank line
    assert by_text(at(0, UNSURE, [word, newline, newline])) == (1, False)  # a new step
