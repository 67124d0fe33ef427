"""A Responses request -> the chat request it means, served by chat's one generation path.

    instructions + the stored conversation (previous_response_id) + input
        -> messages          (a system message, then user/assistant/tool turns)
    max_output_tokens -> max_tokens   text.format -> response_format
    tools [{"type": "function", "name", ..}] -> [{"type": "function", "function": {..}}]
    tool_choice {"type": "function", "name"} -> {"type": "function", "function": {"name"}}
    temperature, top_p, parallel_tool_calls and PASSED_THROUGH: as they are

so every field means on /v1/responses what it means on chat, checked by the same code.
A mistake found there is reported under the Responses name of the field
(`response_format.json_schema.schema` -> `text.format.schema`, `messages` -> `input`).

Items become chat messages: a function_call joins the assistant turn before it (the
answer's text and its calls are one turn, as the model wrote them), a
function_call_output is a tool turn. The previous response's conversation is kept in
the same form, so a continuation renders exactly the prompt of the turn before plus
the new turns, and the engines' prefix cache serves the common part.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from trd.frontend.errors import ApiError
from trd.frontend.openai_api import GenRequest, check_model, parse_chat, validate
from trd.frontend.responses_api.schema import (
    FunctionCallItem,
    FunctionCallOutputItem,
    Item,
    MessageItem,
    ResponsesRequest,
)

Message = dict[str, Any]  # a chat message, as chat's schema takes it
# Chat's fields that mean the same here: the per-request routing fields and priority
# are parsed where chat parses them.
PASSED_THROUGH = ("temperature", "top_p", "parallel_tool_calls", "routing", "priority")
_CHAT_NAMES = re.compile(
    r"response_format\.json_schema\.schema|response_format|max_tokens|messages"
    r"|(tools\[\d+\])\.function|tool_choice\.function"
)


def _responses_name(m: re.Match[str]) -> str:
    found = m.group(0)
    if m.group(1):  # tools[i].function.name -> tools[i].name
        return m.group(1)
    return {"response_format.json_schema.schema": "text.format.schema",
            "response_format": "text.format", "max_tokens": "max_output_tokens",
            "messages": "input", "tool_choice.function": "tool_choice"}[found]  # fmt: skip


@contextmanager
def responses_names() -> Iterator[None]:
    """An ApiError raised inside names the Responses fields, not chat's."""
    try:
        yield
    except ApiError as exc:
        param = None if exc.param is None else _CHAT_NAMES.sub(_responses_name, exc.param)
        message = _CHAT_NAMES.sub(_responses_name, exc.message)
        raise ApiError(exc.status, message, param, exc.code, exc.type) from None


def parse_responses(body: Any, served: str, vocab_size: int) -> ResponsesRequest:
    req = validate(ResponsesRequest, body, vocab_size)
    check_model(req.model, served)
    return req


def as_messages(items: Sequence[Item]) -> list[Message]:
    """Items as chat messages (see the module's note)."""
    out: list[Message] = []
    for item in items:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
            if out and out[-1]["role"] == "assistant":
                out[-1] = {**out[-1], "tool_calls": [*out[-1].get("tool_calls", ()), call]}
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
    return out


def input_messages(req: ResponsesRequest) -> list[Message]:
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    return as_messages(req.input)


def chat_request(
    req: ResponsesRequest,
    body: dict[str, Any],
    conversation: Sequence[Message],
    served: str,
    vocab_size: int,
) -> GenRequest:
    """The chat request `req` means, after `conversation` (the stored turns before it and
    its input, without the instructions)."""
    system = [] if req.instructions is None else [{"role": "system", "content": req.instructions}]
    chat: dict[str, Any] = {"model": req.model, "messages": [*system, *conversation],
                            "stream": bool(req.stream)}  # fmt: skip
    chat |= {key: body[key] for key in PASSED_THROUGH if key in body}
    if req.max_output_tokens is not None:
        chat["max_tokens"] = req.max_output_tokens
    if req.tools:
        chat["tools"] = [
            {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
            for t in req.tools
        ]
    if isinstance(req.tool_choice, str):
        chat["tool_choice"] = req.tool_choice
    elif req.tool_choice is not None:
        chat["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    fmt = req.text.format if req.text is not None else None
    if fmt is not None:
        spec = {"name": fmt.get("name"), "schema": fmt.get("schema")}
        chat["response_format"] = {"type": fmt.get("type"), "json_schema": spec}
    with responses_names():
        return parse_chat(chat, served, vocab_size)
