"""The Responses API's parts without engines: what a request becomes on the wire, the
items it is built from and into, and a failure after the stream's headers (the app over
the wire, tests/frontend_wire.py; the real daemon: test_e2e_responses.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trd.frontend.errors import ApiError, bad
from trd.frontend.responses_api.output import OutputItems
from trd.frontend.responses_api.request import as_messages, responses_names
from trd.frontend.responses_api.schema import (
    FunctionCallItem,
    FunctionCallOutputItem,
    Item,
    MessageItem,
)
from trd.frontend.tokens import PromptEncoder
from trd.frontend.tools import parse_tools
from trd.protocol import RoutingParams

from frontend_wire import MODEL, assert_error, post
from test_frontend_routing import REFUSED, SERVED

FN = {"type": "function", "name": "add", "parameters": {"type": "object"}}


def respond(
    encoder: PromptEncoder, failing: int | None = None, policy: str = "rstitch", **fields: Any
) -> Any:
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 4, **fields}
    return post(encoder, "/v1/responses", json.dumps(body).encode(), failing=failing,
                policy=policy)  # fmt: skip


def test_fields_reach_the_engines_as_chat_would_send_them(encoder: PromptEncoder) -> None:
    fmt = {"type": "json_schema", "name": "x", "schema": {"type": "object"}}
    ans = respond(encoder, temperature=0.5, top_p=0.9, text={"format": fmt})
    assert ans.status == 200, ans.body
    (submit,) = ans.submits
    params = submit.params
    assert (params.max_tokens, params.temperature, params.top_p) == (4, 0.5, 0.9)
    assert params.grammar  # the schema's grammar, compiled by chat's structured outputs
    assert ans.body["usage"] == {"input_tokens": len(submit.prompt), "output_tokens": 3,
                                 "total_tokens": len(submit.prompt) + 3,
                                 "input_tokens_details": {"cached_tokens": 0},
                                 "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
    assert ans.body["tokens_per_model"] == {"small": 2, "large": 1}


@pytest.mark.parametrize(("fields", "policy", "routing"), SERVED)
def test_routing_and_priority_are_chats(
    encoder: PromptEncoder, fields: dict[str, Any], policy: str, routing: RoutingParams
) -> None:
    """The request's own routing and priority, parsed and checked where chat's are."""
    ans = respond(encoder, policy=policy, priority=-3, **fields)
    assert ans.status == 200, ans.body
    assert (ans.submits[0].params.routing, ans.submits[0].params.priority) == (routing, -3)


@pytest.mark.parametrize(("fields", "policy", "param", "part"), REFUSED)
def test_bad_routing_and_priority_are_400s_naming_the_field(
    encoder: PromptEncoder, fields: dict[str, Any], policy: str, param: str, part: str
) -> None:
    ans = respond(encoder, policy=policy, **fields)
    assert_error(ans, 400, param)
    assert part in ans.body["error"]["message"], ans.body


@pytest.mark.parametrize("stream", [False, True])
def test_an_engine_failure_fails_the_response(encoder: PromptEncoder, stream: bool) -> None:
    ans = respond(encoder, failing=1, stream=stream)
    if not stream:
        assert ans.status == 500 and ans.body["error"]["message"] == "wire: failed"
        return
    assert ans.status == 200  # the headers went out first: the error ends the events
    events = [json.loads(block.split("\ndata: ", 1)[1]) for block in ans.body.split("\n\n")
              if block.startswith("event: ")]  # fmt: skip
    error, failed = events[-2:]
    assert error["type"] == "error" and error["message"] == "wire: failed"
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "wire: failed"}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_items_become_chat_turns_with_calls_in_the_answer_turn() -> None:
    items: list[Item] = [
        MessageItem(role="user", content="Add 1."),
        MessageItem(role="assistant", content="Adding."),
        FunctionCallItem(type="function_call", call_id="c1", name="add", arguments="{}"),
        FunctionCallItem(type="function_call", call_id="c2", name="add", arguments="{}"),
        FunctionCallOutputItem(type="function_call_output", call_id="c1", output="2"),
        FunctionCallItem(type="function_call", call_id="c3", name="add", arguments="{}"),
    ]
    turns = as_messages(items)
    assert [t["role"] for t in turns] == ["user", "assistant", "tool", "assistant"]
    assert turns[1]["content"] == "Adding." and [c["id"] for c in turns[1]["tool_calls"]] == [
        "c1", "c2"]  # fmt: skip
    assert turns[2] == {"role": "tool", "tool_call_id": "c1", "content": "2"}
    assert turns[3]["content"] is None and turns[3]["tool_calls"][0]["id"] == "c3"


def test_an_auto_answer_is_its_text_then_its_calls() -> None:
    tools = parse_tools([{"type": "function", "function": FN}], "auto")
    out = OutputItems(tools)
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    events = [e for piece in ["Let me ", "add.\n<tool", call[5:]] for e in out.feed(piece)]
    events += out.finish(cut_off=False)
    assert [e["type"].removeprefix("response.") for e in events] == [
        "output_item.added", "content_part.added", "output_text.delta", "output_text.delta",
        "output_text.done", "content_part.done", "output_item.done",  # the text closes first
        "output_item.added", "function_call_arguments.delta", "function_call_arguments.done",
        "output_item.done"]  # fmt: skip
    message, fn = out.items
    assert message["content"][0]["text"] == "Let me add.\n" and message["status"] == "completed"
    assert (fn["name"], json.loads(fn["arguments"])) == ("add", {"a": 1})
    assert [e["output_index"] for e in events] == [0] * 7 + [1] * 4
    empty = OutputItems(None)
    assert [e["type"].removeprefix("response.") for e in empty.finish(cut_off=True)] == [
        "output_item.added", "content_part.added", "output_text.done", "content_part.done",
        "output_item.done"]  # fmt: skip
    assert empty.items[0]["status"] == "incomplete" and empty.items[0]["content"][0]["text"] == ""


def test_chat_errors_are_told_in_the_responses_names() -> None:
    cases = [("response_format.json_schema.schema", "text.format.schema"),
             ("tools[3].function.parameters", "tools[3].parameters"),
             ("tool_choice.function.name", "tool_choice.name"), ("max_tokens", "max_output_tokens"),
             ("messages", "input")]  # fmt: skip
    for chat, ours in cases:
        with pytest.raises(ApiError) as err, responses_names():
            raise bad(chat, f"cannot be combined with {chat}")
        assert err.value.param == ours
        assert err.value.message == f"{ours}: cannot be combined with {ours}"
