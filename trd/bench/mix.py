"""The soak mix: the request shapes of hours of mixed traffic (`bench serve --mix soak`).

Request i is drawn from a generator seeded by (seed, i), so a run's requests are a
function of its seed whatever the timing:

    endpoint     chat or completions, half each
    bad field    10% carry one invalid field (BAD_FIELDS): the server must refuse
                 them with a 4xx and serve on
    stream       half streamed; 30% of the good streams are cut (the client closes the
                 connection) after 1 .. max_tokens / 2 output chunks
    max_tokens   1-64; temperature 0-1 (two decimals)
    grammar      a share of the requests (`grammars`, default 10%) constrained by one of
                 GRAMMARS: a service keeps a few schemas, not a new one a request
    prompt       5-80 words drawn at random from the chat prompts' words (no two alike:
                 nothing to share), half of them after one shared system text (the first
                 16 chat prompts: 175 Qwen tokens, a prefix cache serves it); with the
                 answer, within 1024 tokens of the fixtures' tokenizer
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from trd.bench.chat_prompts import CHAT_PROMPTS

MAX_TOKENS = 64
STREAM_SHARE, CUT_SHARE, BAD_SHARE, SHARED_PREFIX_SHARE = 0.5, 0.3, 0.1, 0.5
# One invalid field each; an OpenAI-compatible server answers them with a 400.
BAD_FIELDS: tuple[tuple[str, Any], ...] = (
    ("temperature", "hot"), ("max_tokens", -5), ("top_p", 1.5), ("n", 0), ("stop", 12),
    ("structured_outputs", {"regex": "("}),
)  # fmt: skip
GRAMMARS: tuple[dict[str, Any], ...] = (
    {"json": {"type": "object", "properties": {"answer": {"type": "integer"}},
              "required": ["answer"]}},
    {"json": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
              "ok": {"type": "boolean"}}, "required": ["name", "ok"]}},
    {"json": {"type": "array", "items": {"type": "integer"}, "maxItems": 4}},
    {"regex": "[a-z]{1,8}"}, {"regex": "[0-9]{3}-[0-9]{4}"}, {"regex": "(yes|no), because .{0,20}"},
    {"choice": ["red", "green", "blue"]}, {"choice": ["positive", "negative", "neutral"]},
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Shaped:
    """One request of the mix: its endpoint, body, and what to expect."""

    endpoint: str  # "chat" | "completions"
    body: dict[str, Any]
    cut_after: int | None = None  # streamed: close the connection after this many chunks
    bad: str | None = None  # the invalid field it carries: a 4xx is the right answer


class SoakMix:
    def __init__(
        self, model: str, seed: int = 0, grammars: float = 0.1, token_ids: bool = False
    ) -> None:
        """`token_ids`: ask for return_token_ids (a server that returns them, ours, then
        has each answer's producers in its record)."""
        if not 0 <= grammars <= 1:
            raise ValueError(f"--grammars: a share in [0, 1], got {grammars}")
        self.model, self.seed, self.grammars, self.token_ids = model, seed, grammars, token_ids
        self.system = " ".join(CHAT_PROMPTS[:16])
        self.words = " ".join(CHAT_PROMPTS).split()

    def request(self, i: int) -> Shaped:
        rng = random.Random(f"{self.seed}:{i}")
        chat = rng.random() < 0.5
        stream = rng.random() < STREAM_SHARE
        max_tokens = rng.randint(1, MAX_TOKENS)
        temperature = round(rng.random(), 2)
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens,
                                "temperature": temperature, "stream": stream}  # fmt: skip
        if self.token_ids:
            body["return_token_ids"] = True
        shared = rng.random() < SHARED_PREFIX_SHARE
        text = " ".join(rng.choices(self.words, k=rng.randint(5, 80)))
        if chat:
            system = [{"role": "system", "content": self.system}] if shared else []
            body["messages"] = [*system, {"role": "user", "content": text}]
        else:
            body["prompt"] = f"{self.system}\n{text}" if shared else text
        if rng.random() < self.grammars:
            body["structured_outputs"] = rng.choice(GRAMMARS)
        bad = None
        if rng.random() < BAD_SHARE:
            bad, value = rng.choice(BAD_FIELDS)
            body[bad] = value
        cut = None
        if stream:
            body["stream_options"] = {"include_usage": True}
            if rng.random() < CUT_SHARE and bad is None:
                cut = rng.randint(1, max(1, max_tokens // 2))
        return Shaped("chat" if chat else "completions", body, cut, bad)
