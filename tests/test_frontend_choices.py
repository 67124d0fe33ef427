"""OpenAI's `n` over HTTP with the engines replaced by the wire (frontend_wire): one
engine request per choice, seeds seed + index, choices in bodies and streams by index,
usage summed with the prompt counted once, admission all or nothing.

The real engines behind n: test_e2e_openai.py (each choice equals the oracle's output
for its seed)."""

from __future__ import annotations

from typing import Any

import pytest

from trd.frontend.tokens import PromptEncoder
from trd.protocol import PARAMS_LAYOUT, int_range

from frontend_wire import OUT_TOKENS, assert_error, chat, completion, events, post

TEXT_OUT = len(OUT_TOKENS)


@pytest.mark.parametrize(
    ("seed", "seeds"),
    [(None, [None] * 3), (41, [41, 42, 43]),
     (int_range(PARAMS_LAYOUT["seed"])[1], [int_range(PARAMS_LAYOUT["seed"])[1], 0, 1])],
)  # fmt: skip
def test_each_choice_is_an_engine_request_with_its_own_seed(
    encoder: PromptEncoder, seed: int | None, seeds: list[int | None]
) -> None:
    ans = post(encoder, "/v1/completions", completion(n=3, seed=seed, return_token_ids=True))
    assert ans.status == 200, ans.body
    assert [s.params.seed for s in ans.submits] == seeds
    assert len({s.rid for s in ans.submits}) == 3
    assert [s.prompt.tolist() for s in ans.submits[1:]] == [ans.submits[0].prompt.tolist()] * 2
    choices = ans.body["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert len({c["text"] for c in choices}) == 1  # the wire answers every request alike
    assert all(c["token_ids"] == OUT_TOKENS for c in choices)
    prompt = len(ans.submits[0].prompt)
    assert ans.body["usage"] == {
        "prompt_tokens": prompt, "completion_tokens": 3 * TEXT_OUT,
        "total_tokens": prompt + 3 * TEXT_OUT,
    }  # fmt: skip
    assert ans.body["tokens_per_model"] == {"small": 6, "large": 3}


def test_a_chat_stream_opens_ends_and_counts_every_choice(encoder: PromptEncoder) -> None:
    options = {"include_usage": True}
    ans = post(encoder, "/v1/chat/completions", chat(n=2, stream=True, stream_options=options))
    assert ans.status == 200 and ans.ctype == "text/event-stream"
    chunks = events(ans.body)
    per_choice: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        per_choice[choice["index"]].append(choice)
    for seen in per_choice.values():
        assert seen[0]["delta"] == {"role": "assistant", "content": ""}
        assert [c["finish_reason"] for c in seen[1:]] == [None] * (len(seen) - 2) + ["length"]
    texts = ["".join(c["delta"].get("content", "") for c in per_choice[i]) for i in (0, 1)]
    assert texts[0] == texts[1] != ""
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2 * TEXT_OUT


def test_admission_is_all_choices_or_none(encoder: PromptEncoder) -> None:
    ans = post(encoder, "/v1/completions", completion(n=3), busy=6)  # room for 2 of 3
    assert ans.status == 503 and ans.headers.get("Retry-After") == "1"
    msg = "overloaded: 6 requests in flight and 3 more asked, the limit is 8; retry later"
    assert ans.body["error"]["message"] == msg
    assert ans.submits == []
    assert post(encoder, "/v1/completions", completion(n=2), busy=6).status == 200


def test_more_choices_than_the_daemon_ever_takes_is_a_400(encoder: PromptEncoder) -> None:
    ans = post(encoder, "/v1/completions", completion(n=9))  # max_inflight 8
    assert_error(ans, 400, "n")
    assert ans.body["error"]["message"] == "n: must be at most max_inflight (8), got 9"


@pytest.mark.parametrize("stream", [False, True])
def test_a_failed_choice_fails_the_request(encoder: PromptEncoder, stream: bool) -> None:
    ans = post(encoder, "/v1/completions", completion(n=3, stream=stream), failing=2)
    if not stream:
        assert ans.status == 500 and ans.body["error"]["message"] == "wire: failed"
        return
    assert ans.status == 200  # the headers went out first: the error is the last event
    last = events(ans.body)[-1]
    assert last["error"]["message"] == "wire: failed" and last["error"]["code"] == "engine_error"
