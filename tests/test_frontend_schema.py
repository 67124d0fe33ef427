"""The request schema over HTTP at every boundary: integer cases generated from the codec.

Every case ends in a 4xx with OpenAI's error body naming the field, or in a 200 whose
Submit, decoded from the wire (frontend_wire.WireGroup), carries the value sent.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from trd.frontend.tokens import PromptEncoder
from trd.protocol import PARAMS_LAYOUT, TOKEN_ID, Submit, int_range

from frontend_wire import VOCAB, assert_error, chat, completion, post

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
