"""OpenAI request validation (the schema, its errors) and response shapes, without a server."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from trd.frontend.openai_api import ApiError, describe, parse_chat, parse_completion
from trd.frontend.responses import Shaper, Usage

MODEL, VOCAB = "small+large", 2048


def completion(**fields: Any) -> Any:
    return parse_completion({"model": MODEL, "prompt": "hi", **fields}, MODEL, VOCAB)


def test_vllm_no_op_values_are_served() -> None:
    req = completion(
        min_p=0.0, use_beam_search=False, length_penalty=1.0, skip_special_tokens=True,
        spaces_between_special_tokens=True, bad_words=[],
        guided_json=None, structured_outputs=None, priority=0,
    )  # fmt: skip
    assert req.prompt == "hi"


def test_completion_fields_become_sampling_params() -> None:
    req = completion(
        max_tokens=7, temperature=0.5, top_p=0.9, top_k=-1, seed=3, stop="\n\n",
        stop_token_ids=[5, 6], ignore_eos=True, min_tokens=2, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, user="me",
        logprobs=None, n=1,
    )  # fmt: skip
    assert (req.max_tokens, req.stop, req.stream) == (7, ("\n\n",), True)
    assert (req.include_usage, req.continuous_usage) == (True, True)
    p = req.params(16)
    assert (p.temperature, p.top_p, p.top_k, p.seed, p.min_tokens) == (0.5, 0.9, 0, 3, 2)
    assert (p.stop_token_ids, p.ignore_eos) == ((5, 6), True)


def test_openai_defaults_and_nulls() -> None:
    for req in (completion(), completion(stop=None, seed=None, temperature=None, n=None)):
        assert (req.max_tokens, req.params(16).temperature, req.stream) == (16, 1.0, False)
        assert (req.stop, req.params(16).seed, req.params(16).min_tokens) == ((), None, 0)
    chat = parse_chat(
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, MODEL, VOCAB
    )
    assert chat.max_tokens is None  # chat: whatever the context leaves


def test_max_completion_tokens_wins_on_both_endpoints() -> None:
    assert completion(max_tokens=5, max_completion_tokens=9).max_tokens == 9
    assert completion(max_completion_tokens=3).max_tokens == 3


def test_a_tiny_temperature_is_greedy() -> None:
    # vLLM's rule: logits / 1e-300 overflows to inf and the sampler would get NaNs.
    assert completion(temperature=1e-300).params(16).temperature == 0.0
    assert completion(temperature=1e-5).params(16).temperature == 1e-5


def test_unknown_fields_are_ignored_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="trd.frontend"):
        req = completion(frobnicate=1, messages=[], store=True, metadata={"a": "b"})
    assert req.prompt == "hi"
    assert '"frobnicate", "messages", "store", "metadata"' in caplog.text


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("text", "text"), (["text"], "text"), ([1, 2, 3], [1, 2, 3]), ([[4, 5]], [4, 5])],
)
def test_prompt_forms(prompt: Any, expected: Any) -> None:
    assert completion(prompt=prompt).prompt == expected


BAD = [  # (fields, status, param, message part)
    ({"model": "gpt-4"}, 404, "model", "does not exist"),
    ({"model": None}, 400, "model", "must be a valid string, got null"),
    ({"prompt": ""}, 400, "prompt", "at least 1 character"),
    ({"prompt": []}, 400, "prompt", "at least 1 item"),
    ({"prompt": ["a", "b"]}, 400, "prompt", "only one prompt"),
    ({"prompt": [1, 99999]}, 400, "prompt", "99999 at index 1 is outside the vocabulary [0, 2048)"),
    ({"prompt": 3}, 400, "prompt", "expected a string or an array of token ids, got 3"),
    ({"max_tokens": 0}, 400, "max_tokens", "greater than or equal to 1, got 0"),
    ({"max_tokens": 2.5}, 400, "max_tokens", "valid integer, got 2.5"),
    ({"max_tokens": True}, 400, "max_tokens", "valid integer, got true"),
    ({"max_tokens": 5, "min_tokens": 6}, 400, "min_tokens", "at most max_tokens (5), got 6"),
    ({"temperature": "hot"}, 400, "temperature", 'valid number, got "hot"'),
    ({"temperature": 2.5}, 400, "temperature", "less than or equal to 2"),
    ({"top_p": 0}, 400, "top_p", "greater than 0"),
    ({"top_k": -2}, 400, "top_k", "greater than or equal to -1"),
    ({"seed": -1}, 400, "seed", "greater than or equal to 0"),
    (
        {"stop": ["x"] * 100},
        400,
        "stop",
        "at most 16 items after validation, not 100, got an array of 100 items",
    ),
    ({"stop": [""]}, 400, "stop[0]", "at least 1 character"),
    ({"stop": 5}, 400, "stop", "expected a string or an array of strings, got 5"),
    ({"stop_token_ids": [-1]}, 400, "stop_token_ids[0]", "greater than or equal to 0"),
    ({"stop_token_ids": [2048]}, 400, "stop_token_ids", "outside the vocabulary"),
    ({"n": 0}, 400, "n", "greater than or equal to 1, got 0"),
    ({"n": 129}, 400, "n", "less than or equal to 128, got 129"),
    ({"n": 2.0}, 400, "n", "valid integer, got 2.0"),
    ({"stream": "yes"}, 400, "stream", "boolean"),
    ({"stream_options": {"include_usage": True}}, 400, "stream_options", "stream is true"),
    ({"ignore_eos": 1}, 400, "ignore_eos", "boolean"),
    ({"echo": True}, 400, "echo", "only null or false"),
    ({"best_of": 2}, 400, "best_of", "only null or 1"),
    ({"logprobs": 21}, 400, "logprobs", "less than or equal to 20, got 21"),
    ({"logprobs": True}, 400, "logprobs", "valid integer, got true"),
    ({"presence_penalty": 0.5}, 400, "presence_penalty", "only null or 0 or 0.0"),
    ({"frequency_penalty": -1}, 400, "frequency_penalty", "only null or 0 or 0.0"),
    ({"logit_bias": {"5": 1}}, 400, "logit_bias", "only null or {}"),
    (
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        400,
        "tools",
        "only /v1/chat/completions calls tools",
    ),
    ({"min_p": 0.1}, 400, "min_p", "only null or 0 or 0.0"),
    ({"guided_json": {"type": "foo"}}, 400, "guided_json", "refuses it: Invalid type: foo"),
    ({"guided_choice": []}, 400, "guided_choice", "must be a non-empty list of strings"),
    ({"guided_regex": "a(b"}, 400, "guided_regex", "unclosed group"),
    ({"guided_grammar": "start: x"}, 400, "guided_grammar", "refuses it"),
    ({"structured_outputs": {"regex": 5}}, 400, "structured_outputs.regex", "non-empty string"),
    ({"response_format": {"type": "xml"}}, 400, "response_format.type", 'got "xml"'),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        400,
        "response_format.json_schema.schema",
        "must be an object, got null",
    ),
    (
        {"response_format": {"type": "json_object"}, "guided_regex": "a"},
        400,
        "guided_regex",
        "cannot be combined with response_format",
    ),
    ({"use_beam_search": True}, 400, "use_beam_search", "only null or false"),
    ({"skip_special_tokens": False}, 400, "skip_special_tokens", "only null or true"),
    ({"prompt_logprobs": 0}, 400, "prompt_logprobs", "only null is supported, got 0"),
    ({"user": "x" * 41 + "\udfff"}, 400, "user", "lone surrogate (U+DFFF) at index 41"),
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
    assert e.message.startswith(f"{param}: ")
    assert e.body() == {
        "error": {"message": e.message, "type": e.type, "param": param, "code": e.code}
    }


@pytest.mark.parametrize(
    ("value", "shown"),
    [("abc", '"abc"'), ("x" * 41, "a string of 41 characters"),
     ([1] * 50, "an array of 50 items"), ({str(i): i for i in range(41)}, "an object of 41 keys"),
     (["y" * 30] * 2, "an array of 2 items"), (10**50, "a number of 51 digits"), (True, "true"),
     (None, "null"), ("\ud800", '"\\ud800"')],
)  # fmt: skip
def test_values_in_messages_are_whole_or_described(value: Any, shown: str) -> None:
    assert describe(value) == shown


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
    ("fields", "param", "part"),
    [({"top_logprobs": 2}, "top_logprobs", "needs logprobs to be true"),
     ({"logprobs": False, "top_logprobs": 2}, "top_logprobs", "needs logprobs to be true"),
     ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
     ({"logprobs": 2}, "logprobs", "valid boolean")],
)  # fmt: skip
def test_bad_chat_logprobs(fields: dict[str, Any], param: str, part: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], **fields}
    with pytest.raises(ApiError) as err:
        parse_chat(body, MODEL, VOCAB)
    assert (err.value.status, err.value.param) == (400, param)
    assert part in err.value.message


def test_logprobs_reach_the_sampling_params() -> None:
    assert completion(logprobs=3).params(16).logprobs == 3
    assert completion(logprobs=0).params(16).logprobs == 0
    assert completion().params(16).logprobs is None
    chat = [{"role": "user", "content": "x"}]
    for fields, k in (({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 5}, 5),
                      ({"logprobs": False}, None), ({}, None)):  # fmt: skip
        body = {"model": MODEL, "messages": chat, **fields}
        assert parse_chat(body, MODEL, VOCAB).params(16).logprobs == k


@pytest.mark.parametrize(
    ("messages", "param"),
    [("hi", "messages"), ([], "messages"),
     ([{"role": "robot", "content": "x"}], "messages[0].role"),
     ([{"role": "user"}], "messages[0].content"),
     ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content[0].type"),
     ([{"role": "user", "content": "\ud800"}], "messages[0].content")],
)  # fmt: skip
def test_bad_chat_messages(messages: Any, param: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_chat({"model": MODEL, "messages": messages}, MODEL, VOCAB)
    assert (err.value.status, err.value.param) == (400, param)
    assert err.value.message.startswith(f"{param}: ")


def test_body_must_be_an_object() -> None:
    with pytest.raises(ApiError, match="JSON object, got \\[1, 2\\]"):
        parse_completion([1, 2], MODEL, VOCAB)


def test_usage_counts_tokens_per_model_and_switches() -> None:
    usage = Usage.of(5, [[0, 0, 1, 1, 0]], ["small", "large"])
    assert usage.fields() == {
        "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
        "tokens_per_model": {"small": 3, "large": 2},
        "model_switches": 2,
        "large_share": 0.4,
    }
    # n choices: the prompt counts once; tokens and switches add up over the choices
    usage = Usage.of(5, [[0, 1], [1, 1, 1], []], ["small", "large"])
    assert usage.fields() == {
        "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
        "tokens_per_model": {"small": 1, "large": 4},
        "model_switches": 1,
        "large_share": 0.8,
    }
    assert Usage.of(5, [[]], ["small", "large"]).large_share is None  # no output


def test_each_choice_says_who_wrote_it() -> None:
    """Beside the body's totals, each choice's own counts (in a stream: its last chunk)."""
    names = ["small", "large"]
    first, second = Usage.of(5, [[0, 1, 1, 1]], names), Usage.of(5, [[0, 0]], names)
    own = {"tokens_per_model": {"small": 1, "large": 3}, "model_switches": 1, "large_share": 0.75}
    for chat in (True, False):
        shaper = Shaper(chat, "x-1", MODEL)
        choice = shaper.choice(0, "hi", "stop", counts=first)
        assert {k: choice[k] for k in own} == own
        assert shaper.choice(1, "yo", "stop", counts=second)["large_share"] == 0.0
        assert shaper.chunk(0, "", "stop", counts=first)["choices"][0]["model_switches"] == 1
        assert "large_share" not in shaper.chunk(0, "x")["choices"][0]


def test_chat_and_completion_shapes() -> None:
    usage = Usage.of(1, [[0]], ["small"])
    chat = Shaper(True, "chatcmpl-1", MODEL)
    body = chat.final([chat.choice(0, "hi", "stop"), chat.choice(1, "yo", "length")], usage)
    assert [c["message"] for c in body["choices"]] == [
        {"role": "assistant", "content": "hi"}, {"role": "assistant", "content": "yo"}]  # fmt: skip
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert chat.chunk(0, None)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chat.chunk(0, "x")["object"] == "chat.completion.chunk"
    assert chat.chunk(2, "", "length")["choices"][0] == {
        "index": 2, "logprobs": None, "finish_reason": "length", "delta": {}}  # fmt: skip
    text = Shaper(False, "cmpl-1", MODEL)
    assert text.final([text.choice(0, "hi", "length")], usage)["object"] == "text_completion"
    assert text.usage_chunk(usage)["choices"] == []
    assert "usage" not in text.chunk(0, "x")
    assert text.chunk(0, "x", usage=usage)["usage"]["total_tokens"] == 2  # continuous_usage_stats
