"""Constrained workloads for the routing tests: grammars, jobs and a validity check."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
from tokenizers import Tokenizer

from trd.grammar.compile import grammar_for
from trd.protocol import SamplingParams

from routing_cases import Job, prompts

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "n", "tags", "ok"],
    "additionalProperties": False,
}
REGEX = r"[0-9]{3}-[a-z]{2,4}"
CHOICES = ["yes", "no", "maybe"]
LARK = 'start: ("a" | "b") "=" /[0-9]{1,3}/'
GRAMMARS = [("json", SCHEMA), ("regex", REGEX), ("choice", CHOICES), ("grammar", LARK)]


def constrained_jobs(tokenizer_dir: Path, count: int = 16) -> list[tuple[Job, int]]:
    """`count` jobs cycling through GRAMMARS (greedy, and sampled with a seed), each with
    the index of its grammar."""
    out = []
    for i, prompt in enumerate(prompts(tokenizer_dir, count)):
        g = i % len(GRAMMARS)
        sampled = i % 3 == 1
        params = SamplingParams(
            max_tokens=64,
            temperature=0.9 if sampled else 0.0,
            seed=500 + i if sampled else None,
            grammar=grammar_for(*GRAMMARS[g]),
        )
        out.append(((prompt, params), g))
    return out


def assert_valid(tokenizer_dir: Path, grammar: int, tokens: list[int]) -> None:
    """The output, its eos cut off, is what its grammar describes."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    text = tok.decode(tokens, skip_special_tokens=True)
    kind, value = GRAMMARS[grammar]
    if kind == "json":
        jsonschema.validate(json.loads(text), value)
    elif kind == "choice":
        assert text in value
    else:
        pattern = REGEX if kind == "regex" else r"[ab]=[0-9]{1,3}"
        assert re.fullmatch(pattern, text), text
