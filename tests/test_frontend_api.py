"""OpenAI request validation and response shapes, without a server."""

from __future__ import annotations

from typing import Any

import pytest

from trd.frontend.openai_api import ApiError, parse_chat, parse_completion
from trd.frontend.responses import Shaper, Usage

MODEL, VOCAB = "small+large", 2048


def completion(**fields: Any) -> Any:
    return parse_completion({"model": MODEL, "prompt": "hi", **fields}, MODEL, VOCAB)


def test_completion_fields_become_sampling_params() -> None:
    req = completion(
        max_tokens=7, temperature=0.5, top_p=0.9, top_k=-1, seed=3, stop="\n\n",
        stop_token_ids=[5, 6], ignore_eos=True, stream=True,
        stream_options={"include_usage": True}, user="me", logprobs=None, n=1,
    )  # fmt: skip
    assert (req.max_tokens, req.stop, req.stream, req.include_usage) == (7, ("\n\n",), True, True)
    p = req.params
    assert (p.temperature, p.top_p, p.top_k, p.seed) == (0.5, 0.9, 0, 3)
    assert (p.stop_token_ids, p.ignore_eos) == ((5, 6), True)


def test_openai_defaults() -> None:
    req = completion()
    assert (req.max_tokens, req.params.temperature, req.stream) == (16, 1.0, False)
    chat = parse_chat(
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, MODEL, VOCAB
    )
    assert chat.max_tokens is None  # chat: whatever the context leaves


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("text", "text"), (["text"], "text"), ([1, 2, 3], [1, 2, 3]), ([[4, 5]], [4, 5])],
)
def test_prompt_forms(prompt: Any, expected: Any) -> None:
    assert completion(prompt=prompt).prompt == expected


BAD = [  # (fields, status, param, message part)
    ({"model": "gpt-4"}, 404, "model", "does not exist"),
    ({"model": None}, 400, "model", "required"),
    ({"prompt": ""}, 400, "prompt", "must not be empty"),
    ({"prompt": ["a", "b"]}, 400, "prompt", "one prompt"),
    ({"prompt": [1, 99999]}, 400, "prompt", "[0, 2048)"),
    ({"prompt": 3}, 400, "prompt", "expected a string"),
    ({"max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ({"max_tokens": 2.5}, 400, "max_tokens", "integer"),
    ({"max_tokens": True}, 400, "max_tokens", "integer"),
    ({"temperature": "hot"}, 400, "temperature", "number"),
    ({"top_p": 0}, 400, "top_p", "(0, 1]"),
    ({"top_k": -2}, 400, "top_k", ">= -1"),
    ({"seed": -1}, 400, "seed", ">= 0"),
    ({"stop": ["x"] * 100}, 400, "stop", "at most 16"),
    ({"stop": [""]}, 400, "stop", "1 to 256"),
    ({"stop": 5}, 400, "stop", "string"),
    ({"stop_token_ids": [-1]}, 400, "stop_token_ids", "token ids"),
    ({"n": 3}, 400, "n", "n=1"),
    ({"stream": "yes"}, 400, "stream", "boolean"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options", "stream is true"),
    ({"ignore_eos": 1}, 400, "ignore_eos", "boolean"),
    ({"echo": True}, 400, "echo", "only False"),
    ({"best_of": 2}, 400, "best_of", "only 1"),
    ({"messages": []}, 400, "messages", "unrecognized"),
    ({"tools": []}, 400, "tools", "unrecognized"),
]


@pytest.mark.parametrize(
    ("fields", "status", "param", "part"), BAD, ids=[str(b[0])[:40] for b in BAD]
)
def test_bad_completion_fields(fields: dict[str, Any], status: int, param: str, part: str) -> None:
    with pytest.raises(ApiError) as err:
        completion(**fields)
    e = err.value
    assert (e.status, e.param) == (status, param)
    assert part in e.message
    assert e.body() == {
        "error": {"message": e.message, "type": e.type, "param": param, "code": e.code}
    }


def test_chat_messages_and_max_completion_tokens() -> None:
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        "max_tokens": 5,
        "max_completion_tokens": 9,
    }
    req = parse_chat(body, MODEL, VOCAB)
    assert req.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
    ]
    assert req.max_tokens == 9


@pytest.mark.parametrize(
    ("messages", "param"),
    [("hi", "messages"), ([{"role": "robot", "content": "x"}], "messages[0]"),
     ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content")],
)  # fmt: skip
def test_bad_chat_messages(messages: Any, param: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_chat({"model": MODEL, "messages": messages}, MODEL, VOCAB)
    assert (err.value.status, err.value.param) == (400, param)


def test_body_must_be_an_object() -> None:
    with pytest.raises(ApiError, match="JSON object"):
        parse_completion([1, 2], MODEL, VOCAB)


def test_usage_counts_tokens_per_model_and_switches() -> None:
    usage = Usage.of(5, [0, 0, 1, 1, 0], ["small", "large"])
    assert usage.fields() == {
        "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
        "tokens_per_model": {"small": 3, "large": 2},
        "model_switches": 2,
    }


def test_chat_and_completion_shapes() -> None:
    usage = Usage.of(1, [0], ["small"])
    chat = Shaper(True, "chatcmpl-1", MODEL)
    assert chat.final("hi", "stop", usage)["choices"][0]["message"] == {
        "role": "assistant",
        "content": "hi",
    }
    assert chat.chunk(None)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chat.chunk("x")["object"] == "chat.completion.chunk"
    assert chat.chunk("", "length")["choices"][0] == {
        "index": 0, "logprobs": None, "finish_reason": "length", "delta": {}}  # fmt: skip
    text = Shaper(False, "cmpl-1", MODEL)
    assert text.final("hi", "length", usage)["object"] == "text_completion"
    assert text.usage_chunk(usage)["choices"] == []
