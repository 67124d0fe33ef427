"""The Responses API (POST /v1/responses) through the real daemon, with the official openai
client unmodified: create, stream, parse, a function-tool loop over previous_response_id,
the stored responses' bound, and a 400 naming each field we cannot honour.

Two engine processes on the tiny fixtures, handing each response back and forth (the
scripted schedule). The fixtures write noise, so plain text runs to max_output_tokens
and only a grammar (text.format, a required or named tool) makes an answer end early.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from daemon_fixture import Daemon, start_daemon, write_config

STORED = 4  # responses.max_stored of the module's daemon
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


class Pet(BaseModel):
    kind: Literal["cat", "dog"]
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=30)


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]
) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("e2e_responses")
    # max_model_len: the tools' system prompt alone is ~400 fixture tokens
    config = write_config(tmp, tiny_models, ["small", "large"], max_model_len=2048,
                          responses={"max_stored": STORED})  # fmt: skip
    d = start_daemon(config)
    yield d
    assert d.stop() == 0, d.log()


def create(daemon: Daemon, **kw: Any) -> Any:
    kw.setdefault("temperature", 0)
    return daemon.client().responses.create(model=daemon.model, **kw)


def without_ids(output: list[Any]) -> list[dict[str, Any]]:
    """Output items without their fresh ids (item ids, call ids)."""
    return [item.model_dump(exclude={"id", "call_id"}, exclude_none=True) for item in output]


def test_create_from_text_and_items_with_instructions(daemon: Daemon) -> None:
    text = create(daemon, input="Tell me about Paris.", max_output_tokens=8)
    assert text.object == "response" and text.id.startswith("resp_") and text.model == daemon.model
    # noise runs to the limit: cut off there, and said so
    assert text.status == "incomplete" and text.incomplete_details.reason == "max_output_tokens"
    assert text.usage.output_tokens == 8 and text.output_text
    per_model = text.model_extra["tokens_per_model"]
    assert sum(per_model.values()) == 8 and per_model["large"] > 0  # both models wrote
    assert text.model_extra["model_switches"] > 0
    # the same conversation as items: the same prompt, the same greedy answer
    parts = [
        {"type": "input_text", "text": "Tell me about "},
        {"type": "input_text", "text": "Paris."},
    ]
    items = create(daemon, input=[{"role": "user", "content": parts}], max_output_tokens=8,
                   extra_body={"no_such_field": 1})  # unknown fields are ignored  # fmt: skip
    assert items.output_text == text.output_text and items.usage == text.usage
    # instructions are a system message before the input, as chat renders it
    told = create(daemon, input="Tell me about Paris.", instructions="Be brief.",
                  max_output_tokens=3)  # fmt: skip
    chat = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Tell me about Paris."}]  # fmt: skip
    tokens = httpx.post(f"{daemon.url}/tokenize", json={"messages": chat}).json()
    assert told.usage.input_tokens == tokens["count"] > text.usage.input_tokens
    assert told.instructions == "Be brief." and told.usage.output_tokens == 3


def test_stream_tells_each_step_and_ends_as_create(daemon: Daemon) -> None:
    ask = {"input": "Tell me about Rome.", "max_output_tokens": 12}
    whole = create(daemon, **ask)
    events = list(create(daemon, stream=True, **ask))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    deltas = kinds[4:-4]
    assert deltas and set(deltas) == {"response.output_text.delta"}
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]  # fmt: skip
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-4].text == final.output_text == whole.output_text
    assert events[-2].item == final.output[0] and events[0].response.status == "in_progress"
    assert without_ids(final.output) == without_ids(whole.output) and final.usage == whole.usage


def test_parse_and_stream_a_pydantic_model(daemon: Daemon) -> None:
    client, ask = daemon.client(), "Describe a pet."
    parsed = client.responses.parse(model=daemon.model, input=ask, text_format=Pet,
                                    temperature=0, max_output_tokens=64)  # fmt: skip
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Pet)
    with client.responses.stream(model=daemon.model, input=ask, text_format=Pet,
                                 temperature=0, max_output_tokens=64) as stream:  # fmt: skip
        streamed = stream.get_final_response()  # needs a response.completed event
    assert streamed.output_parsed == parsed.output_parsed
    assert without_ids(streamed.output) == without_ids(parsed.output)
    assert streamed.text is not None and streamed.text.format is not None
    assert streamed.text.format.type == "json_schema"  # the request's format, echoed


def test_a_function_tool_loop_over_previous_response_id(daemon: Daemon) -> None:
    """A named call, its output sent back on the next call; that turn renders the whole
    conversation, exactly as the client sending every item itself."""
    ask = "Weather in Paris?"
    named = {"type": "function", "name": "get_weather"}
    first = create(daemon, input=ask, tools=[WEATHER], tool_choice=named, max_output_tokens=64)
    assert first.status == "completed" and [o.type for o in first.output] == ["function_call"]
    call = first.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'}
    kw = {"tools": [WEATHER], "max_output_tokens": 6}
    second = create(daemon, previous_response_id=first.id, input=[result], **kw)
    sent = [{"role": "user", "content": ask}, call.model_dump(exclude_none=True), result]
    resent = create(daemon, input=sent, **kw)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens == resent.usage.input_tokens
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.output_text == resent.output_text


def test_required_calls_stream_their_arguments(daemon: Daemon) -> None:
    ask = {"input": "Weather?", "tools": [WEATHER], "tool_choice": "required",
           "parallel_tool_calls": False, "max_output_tokens": 64}  # fmt: skip
    whole = create(daemon, **ask)
    events = list(create(daemon, stream=True, **ask))
    kinds = [e.type for e in events]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert kinds.count("response.function_call_arguments.delta") > 1  # as it was written
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    final = events[-1].response
    assert kinds[-1] == "response.completed" and args == done.arguments
    jsonschema.validate(json.loads(args), WEATHER["parameters"])
    assert final.output[0].arguments == args == whole.output[0].arguments
    assert without_ids(final.output) == without_ids(whole.output)
    assert "response.output_text.delta" not in kinds


def test_unknown_and_dropped_responses_are_404s(daemon: Daemon) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        create(daemon, input="Hi", previous_response_id="resp_nope", max_output_tokens=1)
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == "previous_response_id"
    assert body["code"] == "previous_response_not_found" and '"resp_nope"' in body["message"]
    client = daemon.client()
    unstored = create(daemon, input="Hi", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    kept = [create(daemon, input=f"Hi {i}", max_output_tokens=1) for i in range(STORED + 1)]
    assert client.responses.retrieve(kept[-1].id).output_text == kept[-1].output_text
    with pytest.raises(openai.NotFoundError) as err:  # the oldest was dropped for the bound
        create(daemon, input="Hi", previous_response_id=kept[0].id, max_output_tokens=1)
    assert "responses.max_stored" in str(err.value)
    metrics = daemon.get("/metrics")[1]
    assert re.search(rf"^trd_responses_stored {STORED}\.0$", metrics, re.M)
    evicted = re.search(r"^trd_responses_evicted_total (\S+)$", metrics, re.M)
    assert evicted is not None and float(evicted[1]) >= 1
    client.responses.delete(kept[-1].id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept[-1].id)


@pytest.mark.parametrize(
    ("extra", "param", "part"),
    [({"tools": [{"type": "web_search"}]}, "tools[0].type", '"web_search"'),
     ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools[0].type",
      '"file_search"'),
     ({"tools": [WEATHER, {"type": "code_interpreter", "container": {"type": "auto"}}]},
      "tools[1].type", '"code_interpreter"'),
     ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice.type", "web_search_preview"),
     ({"background": True}, "background", "true"),
     ({"reasoning": {"effort": "high"}}, "reasoning.effort", '"high"'),
     ({"include": ["message.output_text.logprobs"]}, "include[0]", "logprobs"),
     ({"truncation": "auto"}, "truncation", '"auto"'),
     ({"top_logprobs": 5}, "top_logprobs", "5"),
     ({"conversation": "conv_1"}, "conversation", "conv_1"),
     ({"prompt": {"id": "pmpt_1"}}, "prompt", "pmpt_1"),
     ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
      "input[0].content[0].type", '"input_image"'),
     ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input[0].type",
      '"reasoning"'),
     # found by chat's checks, named as here
     ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
      "text.format.schema", "Invalid type: nope"),
     ({"tools": [{**WEATHER, "parameters": {"type": "nope"}}], "tool_choice": "required"},
      "tools[0].parameters", "Invalid type: nope"),
     ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
      "tool_choice.name", '"nope" is not one of the tools'),
     ({"max_output_tokens": 4000}, "max_output_tokens", "exceed the context of 2048")],
)  # fmt: skip
def test_what_we_cannot_honour_is_a_400_naming_it(
    daemon: Daemon, extra: dict[str, Any], param: str, part: str
) -> None:
    kw = {"input": "Hi", "max_output_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        daemon.client().responses.create(model=daemon.model, **kw)
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == param, body
    assert body["message"].startswith(f"{param}: ") and part in body["message"], body
