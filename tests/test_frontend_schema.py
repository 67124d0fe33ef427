"""The request schema over HTTP, at every boundary: integer cases generated from the codec.

The real `OpenAIApi` app on aiohttp's test server, with the real `Hub`. In place of the
engine processes, `WireGroup` puts each Submit through the real codec (a value that does
not fit the wire fails here as it would there), keeps what decodes, and finishes the
request with a few tokens. Every case ends in a 4xx with OpenAI's error body naming the
field, or in a 200 whose decoded Submit carries the value sent. The real engines behind
HTTP: test_e2e_schema_fuzz.py and test_e2e_openai.py.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import test_utils

from trd.engines.tracker import Tracked
from trd.frontend.app import OpenAIApi, Served
from trd.frontend.body import MAX_BODY_BYTES, MAX_DEPTH
from trd.frontend.hub import Hub
from trd.frontend.metrics import Metrics
from trd.frontend.tokens import PromptEncoder
from trd.protocol import (
    PARAMS_LAYOUT,
    TOKEN_ID,
    FinishReason,
    SamplingParams,
    Submit,
    decode,
    encode,
    int_range,
)

MODEL, VOCAB, CONTEXT = "small+large", 2048, 512
OUT_TOKENS = [72, 101, 108]  # what WireGroup "generates"


class WireGroup:
    """Stands in for the engine processes: every Submit is encoded and decoded as on the wire."""

    def __init__(self) -> None:
        self.listener: Callable[[Tracked, list[tuple[int, int]]], None] | None = None
        self.submits: list[Submit] = []

    def submit(self, prompt: list[int], params: SamplingParams) -> int:
        rid = len(self.submits) + 1
        msg = decode(encode(Submit(rid, np.asarray(prompt, np.int32), params, 0.0)))
        assert isinstance(msg, Submit)
        self.submits.append(msg)
        loop = asyncio.get_running_loop()
        for i, token in enumerate(OUT_TOKENS):  # one token per engine message, in turn
            loop.call_soon(self._emit, rid, token, i % 2, i == len(OUT_TOKENS) - 1)
        return rid

    def _emit(self, rid: int, token: int, model: int, last: bool) -> None:
        tracked = Tracked(rid, finish=FinishReason.LENGTH if last else FinishReason.NONE)
        assert self.listener is not None
        self.listener(tracked, [(token, model)])

    def abort(self, rid: int) -> None: ...
    def forget(self, rid: int) -> None: ...
    def set_active(self, n: int) -> None: ...


@pytest.fixture(scope="module")
def encoder(tiny_models: dict[str, Path]) -> PromptEncoder:
    return PromptEncoder(tiny_models["small"])


@dataclass
class Answer:
    status: int
    ctype: str
    body: Any
    submits: list[Submit]


def post(
    encoder: PromptEncoder, path: str, body: bytes, ctype: str | None = "application/json"
) -> Answer:
    async def run() -> Answer:
        hub, group = Hub(max_inflight=8), WireGroup()
        hub.attach(group)  # type: ignore[arg-type]
        served = Served(["small", "large"], encoder, CONTEXT, VOCAB, created=0)
        app = OpenAIApi(served, hub, Metrics(dict, lambda: 0)).app()
        async with test_utils.TestClient(test_utils.TestServer(app)) as client:
            headers = {} if ctype is None else {"Content-Type": ctype}
            resp = await client.post(path, data=body, headers=headers)
            raw = await resp.read()
        text = raw.decode()
        data = json.loads(text) if resp.content_type == "application/json" else text
        return Answer(resp.status, resp.content_type, data, group.submits)

    return asyncio.run(run())


def completion(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "def f(", "max_tokens": 4, **fields}).encode()


def chat(**fields: Any) -> bytes:
    messages = [{"role": "user", "content": "hi"}]
    return json.dumps({"model": MODEL, "messages": messages, "max_tokens": 4, **fields}).encode()


def assert_error(ans: Answer, status: int, param: str | None) -> None:
    assert ans.status == status, ans.body
    assert ans.ctype == "application/json"
    err = ans.body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["param"], err["type"]) == (param, "invalid_request_error"), err
    if param is not None:
        assert err["message"].startswith(f"{param}: "), err
    assert ans.submits == []  # nothing reached the engines


# --- integers: the last valid and first invalid value at both ends of each wire field ---
# API field -> (its wire field, the least value the API takes)
API_INTS = {
    "max_tokens": ("max_tokens", 1), "max_completion_tokens": ("max_tokens", 1),
    "min_tokens": ("min_tokens", 0), "top_k": ("top_k", -1), "seed": ("seed", 0),
}  # fmt: skip
# Fields whose largest wire value is refused for another reason: the context (512 tokens),
# or min_tokens above max_tokens.
BOUND_ELSEWHERE = ("max_tokens", "max_completion_tokens", "min_tokens")


def int_cases() -> list[tuple[str, Any, str | None]]:
    """(field, value, None if it must be served, else the param its 400 names)."""
    cases: list[tuple[str, Any, str | None]] = []
    for field, (wire, low) in API_INTS.items():
        high = int_range(PARAMS_LAYOUT[wire])[1]
        cases += [(field, low - 1, field), (field, low, None), (field, high + 1, field)]
        cases += [(field, high, field if field in BOUND_ELSEWHERE else None)]
        cases += [(field, v, field) for v in (1.0, True, "1", [1])]
    return cases


def sent(field: str, value: int, submit: Submit) -> None:
    """The served value reached the engines as the API documents it."""
    p = submit.params
    got = {"max_tokens": p.max_tokens, "max_completion_tokens": p.max_tokens,
           "min_tokens": p.min_tokens, "top_k": p.top_k, "seed": p.seed}[field]  # fmt: skip
    assert got == (0 if field == "top_k" and value == -1 else value)


@pytest.mark.parametrize(("field", "value", "param"), int_cases())
def test_integer_boundaries_from_the_wire_widths(
    encoder: PromptEncoder, field: str, value: Any, param: str | None
) -> None:
    for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
        ans = post(encoder, path, body(**{field: value}))
        if param is None:
            assert ans.status == 200, ans.body
            sent(field, value, ans.submits[0])
        else:
            assert_error(ans, 400, param)


def token_id_cases() -> list[tuple[int, bool]]:
    low, high = int_range(TOKEN_ID)
    return [(-1, False), (0, True), (VOCAB - 1, True), (VOCAB, False), (high, False),
            (high + 1, False), (low - 1, False)]  # fmt: skip


@pytest.mark.parametrize(("token", "ok"), token_id_cases())
def test_token_ids_in_the_prompt_and_stop_token_ids(
    encoder: PromptEncoder, token: int, ok: bool
) -> None:
    on_wire = 0 <= token <= int_range(TOKEN_ID)[1]  # else the item itself is named
    ans = post(encoder, "/v1/completions", completion(prompt=[5, token]))
    if ok:
        assert ans.status == 200 and ans.submits[0].prompt.tolist() == [5, token]
    else:
        assert_error(ans, 400, "prompt" if on_wire else "prompt[1]")
    ans = post(encoder, "/v1/chat/completions", chat(stop_token_ids=[token]))
    if ok:
        assert ans.status == 200 and ans.submits[0].params.stop_token_ids == (token,)
    else:
        assert_error(ans, 400, "stop_token_ids" if on_wire else "stop_token_ids[0]")


# --- floats: non-finite, signed zero, subnormal, the ends of each range and just past ---
FLOATS = {"temperature": (0.0, 2.0, True), "top_p": (0.0, 1.0, False)}  # low, high, low ok


def float_cases() -> list[tuple[str, float, bool]]:
    cases = []
    for field, (low, high, low_ok) in FLOATS.items():
        for v in (math.nan, math.inf, -math.inf, -0.0, 5e-324, 1e308, low, high,
                  math.nextafter(high, math.inf), math.nextafter(low, -math.inf)):  # fmt: skip
            valid = math.isfinite(v) and (low <= v if low_ok else low < v) and v <= high
            cases.append((field, v, valid))
    return cases


@pytest.mark.parametrize(("field", "value", "ok"), float_cases())
def test_float_boundaries(encoder: PromptEncoder, field: str, value: float, ok: bool) -> None:
    ans = post(encoder, "/v1/completions", completion(**{field: value, "seed": 1}))
    if not ok:
        assert_error(ans, 400, field)
        return
    assert ans.status == 200, ans.body
    got = getattr(ans.submits[0].params, field)
    # A temperature too small to divide logits by is greedy (0), as in vLLM.
    assert got == (0.0 if field == "temperature" and value < 1e-5 else value)


# --- strings: a lone surrogate wherever the client writes text ---
LONE = "ok \ud800"
UNICODE_CASES = [  # (path, body, param)
    ("/v1/completions", completion(prompt=LONE), "prompt"),
    ("/v1/completions", completion(prompt=[LONE]), "prompt"),
    ("/v1/completions", completion(stop=LONE), "stop"),
    ("/v1/completions", completion(stop=["fine", LONE]), "stop[1]"),
    ("/v1/completions", completion(user=LONE), "user"),
    ("/v1/completions", completion(model=LONE), "model"),
    ("/v1/chat/completions", chat(messages=[{"role": "user", "content": LONE}]),
     "messages[0].content"),
    ("/v1/chat/completions",
     chat(messages=[{"role": "user", "content": [{"type": "text", "text": LONE}]}]),
     "messages[0].content[0].text"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "param"), UNICODE_CASES)
def test_a_lone_surrogate_is_a_400_naming_the_field(
    encoder: PromptEncoder, path: str, body: bytes, param: str
) -> None:
    assert b"\\ud800" in body  # json.dumps escapes it; json.loads gives it back lone
    ans = post(encoder, path, body)
    assert_error(ans, 400, param)
    assert "lone surrogate (U+D800) at index 3" in ans.body["error"]["message"]


def test_an_escaped_surrogate_pair_is_valid_text(encoder: PromptEncoder) -> None:
    ans = post(encoder, "/v1/completions", completion(prompt="\ud83d\ude42", user="\U0001f642"))
    assert ans.status == 200, ans.body


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


def events(text: str) -> list[Any]:
    datas = [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    return [json.loads(d) for d in datas[:-1]]


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
