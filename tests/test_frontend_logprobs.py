"""OpenAI's two log-probability shapes from a Generation's per-token values."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from trd.frontend.logprobs import FLOOR, LogprobShaper
from trd.supervisor.generation import Generation, Logprob


@pytest.fixture(scope="module")
def tok(tiny_models: dict[str, Path]) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_models["small"] / "tokenizer.json"))


def generation(tok: Tokenizer) -> tuple[Generation, list[str]]:
    ids = tok.encode("ab cd").ids
    gen = Generation(1, 3, tokens=list(ids), models=[0] * len(ids))
    for p, t in enumerate(ids):  # the chosen token is the top one, then a banned token
        gen.logprobs[p] = Logprob(-0.5 - p, [(t, -0.5 - p), (0, float("-inf"))])
    return gen, [tok.decode([t]) for t in ids]


def test_completions_shape_with_offsets_across_spans(tok: Tokenizer) -> None:
    gen, texts = generation(tok)
    shaper = LogprobShaper(tok, chat=False)
    first, rest = shaper.span(gen, 0, 1), shaper.span(gen, 1, len(texts))
    assert first["tokens"] + rest["tokens"] == texts
    assert first["token_logprobs"] + rest["token_logprobs"] == [-0.5 - p for p in range(len(texts))]
    offsets = first["text_offset"] + rest["text_offset"]
    assert offsets == [sum(map(len, texts[:p])) for p in range(len(texts))]  # a stream goes on
    eos = tok.decode([0], skip_special_tokens=False)
    assert first["top_logprobs"][0] == {texts[0]: -0.5, eos: FLOOR}  # JSON has no -inf


def test_chat_shape(tok: Tokenizer) -> None:
    gen, texts = generation(tok)
    content = LogprobShaper(tok, chat=True).span(gen, 0, 1)["content"]
    assert content == [{
        "token": texts[0], "logprob": -0.5, "bytes": list(texts[0].encode()),
        "top_logprobs": [
            {"token": texts[0], "logprob": -0.5, "bytes": list(texts[0].encode())},
            {"token": tok.decode([0], skip_special_tokens=False), "logprob": FLOOR,
             "bytes": list(tok.decode([0], skip_special_tokens=False).encode())},
        ],
    }]  # fmt: skip
