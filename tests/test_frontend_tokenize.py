"""vLLM's /tokenize and /detokenize over HTTP (the real app and tokenizer; no engines)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trd.frontend.tokens import PromptEncoder

from frontend_wire import CONTEXT, MODEL, VOCAB, Answer, assert_error, chat, post

TEXT = "def f(x): return 'ü'"


def call(encoder: PromptEncoder, path: str, **fields: Any) -> Answer:
    return post(encoder, path, json.dumps(fields).encode())


@pytest.mark.parametrize("fields", [{}, {"model": MODEL}, {"add_special_tokens": False}])
def test_a_prompt_becomes_the_ids_generation_sees(
    encoder: PromptEncoder, fields: dict[str, Any]
) -> None:
    ans = call(encoder, "/tokenize", prompt=TEXT, **fields)
    ids = encoder.encode(TEXT)
    assert ans.body == {"count": len(ids), "max_model_len": CONTEXT, "tokens": ids}
    assert ans.status == 200 and ans.submits == []  # nothing reached the engines


def test_a_chat_becomes_the_prompt_its_chat_completion_sends(encoder: PromptEncoder) -> None:
    sent = json.loads(chat())["messages"]
    generated = post(encoder, "/v1/chat/completions", chat()).submits[0].prompt.tolist()
    assert call(encoder, "/tokenize", messages=sent).body["tokens"] == generated
    # the template's fields apply as in a chat completion
    closed = call(encoder, "/tokenize", messages=sent, add_generation_prompt=False).body
    assert closed["tokens"] == generated[: closed["count"]] and closed["count"] < len(generated)


def test_detokenize_gives_back_the_text(encoder: PromptEncoder) -> None:
    ids = call(encoder, "/tokenize", prompt=TEXT).body["tokens"]
    ans = call(encoder, "/detokenize", tokens=ids, model=MODEL)
    assert (ans.status, ans.body) == (200, {"prompt": TEXT})


@pytest.mark.parametrize(
    ("path", "fields", "status", "param", "part"),
    [("/tokenize", {"prompt": 5}, 400, "prompt", "valid string"),
     ("/tokenize", {}, 400, "prompt", "required"),
     ("/tokenize", {"prompt": "x", "model": "gpt-4"}, 404, "model", "does not exist"),
     ("/tokenize", {"messages": []}, 400, "messages", "at least 1 item"),
     ("/tokenize", {"messages": [{"role": "user", "content": "x"}],
                    "chat_template_kwargs": {"tokenize": True}}, 400, "chat_template_kwargs",
      "cannot be passed"),
     ("/detokenize", {"tokens": [1, VOCAB]}, 400, "tokens", "outside the vocabulary"),
     ("/detokenize", {"tokens": []}, 400, "tokens", "at least 1 item"),
     ("/detokenize", {"tokens": "abc"}, 400, "tokens", "valid list")],
)  # fmt: skip
def test_mistakes_are_openai_errors_naming_the_field(
    encoder: PromptEncoder, path: str, fields: dict[str, Any], status: int, param: str, part: str
) -> None:
    ans = call(encoder, path, **fields)
    if status == 404:
        assert ans.status == 404 and ans.body["error"]["param"] == param
    else:
        assert_error(ans, status, param)
    assert part in ans.body["error"]["message"], ans.body
