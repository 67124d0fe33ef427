"""The request body over HTTP: nesting, content type, size, encoding; batches, streams.

Every case ends in a 4xx with OpenAI's error body, or a 200 (frontend_wire's harness).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trd.frontend.body import MAX_BODY_BYTES, MAX_DEPTH
from trd.frontend.tokens import PromptEncoder
from trd.supervisor.hub import State

from frontend_wire import OUT_TOKENS, assert_error, chat, completion, events, post


# --- the body: nesting, content type, size, encoding, JSON ---
def nested(levels: int) -> bytes:
    """A completion body whose arrays and objects nest `levels` deep in all."""
    inner = "[" * (levels - 1) + "]" * (levels - 1)
    return completion()[:-1] + f', "extra": {inner}}}'.encode()


def test_nesting_depth_at_and_past_the_bound(encoder: PromptEncoder) -> None:
    assert post(encoder, "/v1/completions", nested(MAX_DEPTH)).status == 200
    for levels in (MAX_DEPTH + 1, 100_000):
        ans = post(encoder, "/v1/completions", nested(levels))
        assert_error(ans, 400, None)
        assert f"nest {levels} deep, at most {MAX_DEPTH}" in ans.body["error"]["message"]
    quoted = completion(prompt="[" * 100 + "{" * 100)  # brackets in strings do not count
    assert post(encoder, "/v1/completions", quoted).status == 200


@pytest.mark.parametrize(
    ("ctype", "status"),
    [("application/json", 200), ("application/json; charset=utf-8", 200),
     ("Application/JSON; charset=UTF-8", 200), ("text/plain", 415), (None, 415),
     ("application/x-www-form-urlencoded", 415), ("application/json; charset=latin-1", 415)],
)  # fmt: skip
def test_content_type(encoder: PromptEncoder, ctype: str | None, status: int) -> None:
    ans = post(encoder, "/v1/completions", completion(), ctype=ctype)
    if status == 200:
        assert ans.status == 200, ans.body
    else:
        assert_error(ans, 415, None)
        assert ans.body["error"]["code"] == "unsupported_media_type"
        assert ans.body["error"]["message"].startswith("Content-Type must be application/json")


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [(b"", 400, "not valid JSON"), (b"null", 400, "JSON object, got null"),
     (b"[1, 2]", 400, "JSON object, got [1, 2]"), (b'{"model": ', 400, "not valid JSON"),
     (b'{"model": "\xff"}', 400, "not UTF-8"), (b'{"seed": ' + b"9" * 5000 + b"}", 400, "digits"),
     (completion(pad="x" * (MAX_BODY_BYTES - 100)), 200, ""),
     (completion(pad="x" * MAX_BODY_BYTES), 413, f"exceeds {MAX_BODY_BYTES} bytes")],
    ids=["empty", "null", "array", "cut", "latin-1", "5000 digits", "at the size limit", "huge"],
)  # fmt: skip
def test_bodies(encoder: PromptEncoder, body: bytes, status: int, says: str) -> None:
    ans = post(encoder, "/v1/completions", body)
    if status == 200:
        assert ans.status == 200, ans.body
        return
    assert_error(ans, status, None)
    assert says in ans.body["error"]["message"]


@pytest.mark.parametrize(
    ("prompt", "param"),
    [(["one"], None), ([[1, 2]], None), (["one", "two"], "prompt"), ([[1], [2]], "prompt"),
     ([], "prompt"), ([[]], "prompt"), ([1, "x"], "prompt[1]"), ([[[1]]], "prompt[0]")],
)  # fmt: skip
def test_batch_prompts(encoder: PromptEncoder, prompt: Any, param: str | None) -> None:
    ans = post(encoder, "/v1/completions", completion(prompt=prompt))
    if param is None:
        assert ans.status == 200, ans.body
    else:
        assert_error(ans, 400, param)


def test_what_real_clients_send_is_served(encoder: PromptEncoder) -> None:
    # guidellm (vLLM's load tester) and the openai client's extra_body fields.
    ans = post(encoder, "/v1/completions", completion(
        stop=None, ignore_eos=True, min_tokens=2, seed=7, user="bench", n=1, top_k=-1,
        stop_token_ids=[2], max_completion_tokens=3, logprobs=None, echo=False, tools=[],
        stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True},
        frobnicate={"unknown": ["fields", "are", "ignored"]},
    ))  # fmt: skip
    assert ans.status == 200, ans.body
    p = ans.submits[0].params
    assert (p.ignore_eos, p.min_tokens, p.seed, p.max_tokens, p.stop_token_ids) == (
        True, 2, 7, 3, (2,)
    )  # fmt: skip


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(
    encoder: PromptEncoder, path: str, include_usage: bool
) -> None:
    body = chat if "chat" in path else completion
    options = {"include_usage": include_usage, "continuous_usage_stats": True}
    ans = post(encoder, path, body(stream=True, stream_options=options))
    assert ans.status == 200 and ans.ctype == "text/event-stream"
    chunks = events(ans.body)
    usage_only = [c for c in chunks if not c["choices"]]
    assert len(usage_only) == include_usage
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == len(OUT_TOKENS)
    prompt = len(ans.submits[0].prompt)
    assert all(c["usage"]["prompt_tokens"] == prompt for c in chunks)
    assert chunks[-1]["tokens_per_model"] == {"small": 2, "large": 1}
    plain = events(post(encoder, path, body(stream=True)).body)
    assert all("usage" not in c for c in plain)


def test_a_chat_template_that_refuses_the_messages_is_a_400(tiny_models: dict[str, Path]) -> None:
    # Real templates (Qwen3's) call raise_exception() on conversations they cannot render.
    refusing = PromptEncoder(tiny_models["small"])
    refusing.hf.chat_template = "{{ raise_exception('No user query found in messages.') }}"
    ans = post(refusing, "/v1/chat/completions", chat())
    assert_error(ans, 400, "messages")
    assert "No user query found" in ans.body["error"]["message"]


def test_min_tokens_past_what_the_context_leaves_is_a_400(encoder: PromptEncoder) -> None:
    # No max_tokens in a chat: the output may fill the context, which is less than this.
    body = json.loads(chat(min_tokens=600))
    del body["max_tokens"]
    assert_error(
        post(encoder, "/v1/chat/completions", json.dumps(body).encode()), 400, "min_tokens"
    )
    served = post(encoder, "/v1/chat/completions", chat(min_tokens=4, max_tokens=4))
    assert served.status == 200 and served.submits[0].params.min_tokens == 4


@pytest.mark.parametrize(
    ("busy", "detached", "says", "retry_after"),
    [(8, None, "overloaded: 8 requests in flight, the limit is 8; retry later", "1"),
     (0, "restarting", "unavailable: test: restarting", "5"),
     (0, "starting", "unavailable: test: starting", "5"),
     (0, "draining", "unavailable: test: draining", None)],
)  # fmt: skip
def test_a_daemon_that_cannot_take_the_request_says_when_to_retry(
    encoder: PromptEncoder,
    busy: int,
    detached: State | None,
    says: str,
    retry_after: str | None,
) -> None:
    """The openai client honours Retry-After; a draining daemon gives none (it is going)."""
    ans = post(encoder, "/v1/completions", completion(), busy=busy, detached=detached)
    assert ans.status == 503 and ans.body["error"]["type"] == "service_unavailable"
    assert ans.body["error"]["message"] == says
    assert ans.headers.get("Retry-After") == retry_after
    assert ans.submits == []
