"""trd/routers/magpie.py on SmolLM2 (a real chat template): questions in the user's
voice, distinct, each fixed by its own seed whatever the batch, and none that ran past
the token limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from trd.routers import magpie
from trd.testing.smollm2 import ensure_smollm2

CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache"
DTYPE = "float32"  # SmolLM2's stored dtype: bfloat16 is slower on this CPU


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return ensure_smollm2(CACHE_DIR)


def test_questions_are_seeded_per_question_and_start_with_their_starter(smollm2: Path) -> None:
    four = magpie.questions(smollm2, 4, seed=2, dtype=DTYPE)
    assert 0 < len(four) <= 4 and len(set(four)) == len(four)
    assert all(q.split()[0].startswith(magpie.STARTERS) for q in four)
    assert not any("<|im_" in q for q in four)  # the turn's markers are not the question
    # Question i's seed is its own: asking fewer keeps the first ones as they were.
    two = magpie.questions(smollm2, 2, seed=2, dtype=DTYPE)
    assert two == [q for q in four if q.split()[0] in magpie.STARTERS[:2]]


def test_a_question_cut_at_the_limit_is_dropped(
    smollm2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(magpie, "MAX_TOKENS", 2)  # no question ends within 2 tokens
    assert magpie.questions(smollm2, 2, seed=2, dtype=DTYPE) == []
