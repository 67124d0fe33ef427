"""`return_token_ids`: each choice carries its output ids and the model that made each.

Over HTTP with the real app and Hub (frontend_wire's harness: the "engines" emit
OUT_TOKENS from models small, large, small). Without the field no body changes.
"""

from __future__ import annotations

import pytest

from trd.frontend.tokens import PromptEncoder

from frontend_wire import OUT_TOKENS, chat, completion, events, post

MODELS = ["small", "large", "small"]  # WireGroup: token i from model i % 2


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_body_carries_the_ids_and_their_models(encoder: PromptEncoder, path: str) -> None:
    body = chat if "chat" in path else completion
    ans = post(encoder, path, body(return_token_ids=True))
    assert ans.status == 200, ans.body
    choice = ans.body["choices"][0]
    assert (choice["token_ids"], choice["token_models"]) == (OUT_TOKENS, MODELS)
    assert ans.body["tokens_per_model"] == {"small": 2, "large": 1}
    plain = post(encoder, path, body(return_token_ids=False)).body
    assert "token_ids" not in plain["choices"][0] and "token_models" not in plain["choices"][0]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_stream_chunks_carry_the_ids_of_their_text(encoder: PromptEncoder, path: str) -> None:
    body = chat if "chat" in path else completion
    chunks = events(post(encoder, path, body(stream=True, return_token_ids=True)).body)
    with_text = [c for c in chunks if c["choices"] and "token_ids" in c["choices"][0]]
    ids = [t for c in with_text for t in c["choices"][0]["token_ids"]]
    models = [m for c in with_text for m in c["choices"][0]["token_models"]]
    assert (ids, models) == (OUT_TOKENS, MODELS)
    for c in with_text:  # a chunk's ids are those its text was decoded from
        text = c["choices"][0].get("text", c["choices"][0].get("delta", {}).get("content", ""))
        assert encoder.decoder.decode(c["choices"][0]["token_ids"]) == text
    plain = events(post(encoder, path, body(stream=True)).body)
    assert all("token_ids" not in ch for c in plain for ch in c["choices"])


def test_a_stop_string_ends_the_ids_where_the_usage_ends(encoder: PromptEncoder) -> None:
    text = encoder.decoder.decode(OUT_TOKENS)
    ans = post(encoder, "/v1/completions", completion(return_token_ids=True, stop=[text[-1]]))
    choice = ans.body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert len(choice["token_ids"]) == ans.body["usage"]["completion_tokens"]
    assert choice["token_ids"] == OUT_TOKENS[: len(choice["token_ids"])]
    assert len(choice["token_models"]) == len(choice["token_ids"])


def test_the_field_is_a_strict_boolean(encoder: PromptEncoder) -> None:
    ans = post(encoder, "/v1/completions", completion(return_token_ids="yes"))
    assert ans.status == 400 and ans.body["error"]["param"] == "return_token_ids"
