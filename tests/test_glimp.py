"""GlimpRouter: step ends from token ids equal the text rule; its decisions on each model.

The engines' oracle runs (test_routing_inprocess.py, test_routing_processes.py) check
that the daemon routes glimp exactly like the reference loop; here: that the steps it
cuts are the steps the text says (a real tokenizer with "\\n", "\\n\\n", ".\\n" tokens),
and what the small and the large model decide at a step's start, inside it, at its end
and after </think>.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from trd.engines.request import Request
from trd.policies.base import PolicyContext, Route, StepView, host_routes
from trd.policies.factory import make_policy
from trd.policies.glimp import top_entropy
from trd.policies.params import PolicyError, PolicySpec, parse_policy
from trd.policies.steps import StepTable, token_texts
from trd.protocol import SamplingParams
from trd.testing.smollm2 import ensure_smollm2

CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache"


@pytest.fixture(scope="module")
def smollm_dir() -> Path:
    return ensure_smollm2(CACHE_DIR)  # SmolLM2's tokenizer: byte-level BPE with "\n\n" tokens


def test_step_ends_equal_decoding_every_prefix(smollm_dir: Path) -> None:
    tok = Tokenizer.from_file(str(smollm_dir / "tokenizer.json"))
    texts = token_texts(smollm_dir, tok.get_vocab_size())
    table = StepTable.of(texts)
    newlines = [i for i, t in enumerate(texts) if "\n" in t]
    kinds = {
        "all newlines": [i for i in newlines if not texts[i].strip("\n")],
        "ends with newline": [
            i for i in newlines if texts[i].endswith("\n") and texts[i].strip("\n")
        ],
        "newline inside": [i for i in newlines if not texts[i].endswith("\n")],
        "carriage return": [i for i, t in enumerate(texts) if "\r" in t],
    }
    assert all(len(ids) >= 3 for ids in kinds.values()), {k: len(v) for k, v in kinds.items()}
    assert "\n\n" in [texts[i] for i in kinds["all newlines"]]
    rng = random.Random(0)
    blank = kinds["all newlines"] * 40  # often enough for blank lines, split or not
    pool = [i for ids in kinds.values() for i in ids] + blank + rng.sample(range(len(texts)), 400)
    ends = 0
    for _ in range(300):
        seq = [rng.choice(pool) for _ in range(24)]
        tail = 0
        for k in range(len(seq)):
            tail = table.advance(tail, seq[k])
            text = tok.decode(seq[: k + 1], skip_special_tokens=False)
            assert (tail == 2) == text.endswith("\n\n"), (seq[: k + 1], text[-12:])
            ends += tail == 2
    assert ends > 100  # the sequences did end steps, in many ways


def test_split_blank_lines_end_a_step_and_crlf_does_not(smollm_dir: Path) -> None:
    tok = Tokenizer.from_file(str(smollm_dir / "tokenizer.json"))
    table = StepTable.of(token_texts(smollm_dir, tok.get_vocab_size()))

    def tails(parts: list[str]) -> list[int]:
        tail, out = 0, []
        for part in parts:
            (token,) = tok.encode(part).ids  # each part is one token
            tail = table.advance(tail, token)
            out.append(tail)
        return out

    assert tails(["Hello", "\n", "\n"]) == [0, 1, 2]  # "\n\n" across two tokens
    assert tails(["Hello", "\n\n", "The"]) == [0, 2, 0]
    assert tails(["\n", "\n", "\n"]) == [1, 2, 2]  # each "\n" after a blank line ends a step
    assert tails(["\n\n\n", "."]) == [2, 0]
    assert tails(["\r\n", "\n"]) == [1, 2]  # the text ends with "\n\n"
    assert tails(["\r\n", "\r\n"]) == [1, 1]  # "\r\n\r\n" is not "\n\n"
    assert tails(["\n", "\n  "]) == [1, 0]  # spaces after the newline


HIDDEN = 8


@pytest.fixture(scope="module")
def tiny_dir(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["small"]


def policy(model: int, tiny_dir: Path, **params: object) -> object:
    embed = torch.nn.Embedding(2048, HIDDEN)
    spec = PolicySpec("glimp", {"threshold": 1.0, "step_tokens": 4, **params})
    return make_policy(spec, PolicyContext(model, 2, embed, tiny_dir))


def request(output: list[int]) -> Request:
    return Request(1, [5, 6, *output], 2, SamplingParams(), 0.0)


def decide(pol: object, req: Request, logits: torch.Tensor, token: int) -> Route:
    view = StepView(logits, torch.zeros(1, HIDDEN), torch.tensor([token]))
    return host_routes(pol.route([req], view))[0]  # type: ignore[attr-defined]


def logits_with_entropy(h: float) -> torch.Tensor:
    """(1, 2048) logits whose top-20 softmax has entropy h (or more, up to ln 20)."""
    logits = torch.full((1, 2048), -30.0)
    logits[0, :20] = 0.0
    logits[0, 0] = 0.0 if h >= math.log(20) else _peak_for(h)
    return logits


def _peak_for(h: float) -> float:
    lo, hi = 0.0, 40.0
    for _ in range(80):
        mid = (lo + hi) / 2
        x = torch.zeros(1, 20)
        x[0, 0] = mid
        lo, hi = (mid, hi) if float(top_entropy(x)) > h else (lo, mid)
    return hi


def test_top20_entropy_is_renormalised_natural_log() -> None:
    assert float(top_entropy(torch.zeros(1, 50))) == pytest.approx(math.log(20))
    x = torch.full((1, 30), -1e9)
    x[0, :2] = 0.0
    assert float(top_entropy(x)) == pytest.approx(math.log(2))


def test_the_probe_decides_who_writes_the_step(tiny_dir: Path) -> None:
    small, nl = policy(0, tiny_dir), 201  # 201 is "\n" in the fixture tokenizer
    unsure, sure = logits_with_entropy(1.2), logits_with_entropy(0.8)
    r = decide(small, request([]), unsure, 7)
    assert (r.dst, r.commit) == (1, False)  # H >= tau at the first step: drop, large writes
    r = decide(small, request([]), sure, 7)
    assert (r.dst, r.commit) == (0, True)  # the small model keeps the step
    r = decide(small, request([7]), unsure, 8)
    assert (r.dst, r.commit) == (0, True)  # inside its step the small model never asks
    r = decide(small, request([7, 8, nl, nl]), unsure, 9)
    assert (r.dst, r.commit) == (1, False)  # a blank line ended the step: a new probe
    r = decide(small, request([7, 8, 9, 10]), unsure, 9)
    assert (r.dst, r.commit) == (1, False)  # step_tokens=4 ended it too


def test_the_large_model_writes_its_step_and_hands_back(tiny_dir: Path) -> None:
    large, nl, flat = policy(1, tiny_dir), 201, logits_with_entropy(3.0)
    assert decide(large, request([7]), flat, 8) == Route(1, True)  # inside its step
    assert decide(large, request([7, nl]), flat, nl) == Route(0, True)  # "\n" + "\n": end
    assert decide(large, request([7, 8, 9]), flat, 10) == Route(0, True)  # 4th token: end


def test_the_answer_after_think_end_is_the_large_models(tiny_dir: Path) -> None:
    small = policy(0, tiny_dir, think_end=" list")
    large = policy(1, tiny_dir, think_end=" list")
    tok = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    (end,) = tok.encode(" list").ids
    sure = logits_with_entropy(0.5)
    assert decide(small, request([7]), sure, end) == Route(1, True)  # keep it, answer: large
    nl = 201
    assert decide(large, request([7, end, nl]), sure, nl) == Route(1, True)  # no step ends now
    assert decide(large, request([7]), sure, end) == Route(1, True)


def test_glimp_settings_are_checked(tiny_dir: Path) -> None:
    with pytest.raises(PolicyError, match=r"policy.threshold: 3.5: expected a number in \[0, ln"):
        parse_policy("glimp", {"threshold": 3.5}, num_models=2)
    with pytest.raises(PolicyError, match=r"policy.step_tokens: 0"):
        parse_policy("glimp", {"step_tokens": 0}, num_models=2)
    with pytest.raises(PolicyError, match=r"policy.think_end: '</think>': no token"):
        policy(0, tiny_dir, think_end="</think>")  # the fixture tokenizer has none
    policy(0, tiny_dir)  # by default </think> only if the tokenizer has it
