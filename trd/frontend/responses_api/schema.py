"""The request schema of POST /v1/responses: OpenAI's fields, declared once.

    input              a string (one user message) or a list of items:
                         {"role": .., "content": "..." | [input_text / output_text parts]}
                         {"type": "function_call", "call_id", "name", "arguments"}
                         {"type": "function_call_output", "call_id", "output"}
    instructions       a system message before the conversation (not carried over)
    tools              function tools only ({"type": "function", "name", "parameters", ..})
    tool_choice        "none" | "auto" | "required" | {"type": "function", "name": ..}
    text.format        {"type": "text" | "json_object" | "json_schema", "schema": ..}

The sampling fields (temperature, top_p, parallel_tool_calls) and the fields chat shares
are checked by chat's schema when the request is turned into a chat one (`request.py`);
text.format, a tool's name and parameters by the structured-output and tool modules
there. Fields that ask for what this server cannot do (built-in tools, background mode,
reasoning effort, include values, truncation "auto", ...) are accepted only at their
no-op values: anything else is a 400 naming the field and the value. Unknown fields are
ignored, as on chat.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Discriminator, Field, Tag
from pydantic_core import PydanticCustomError

from trd.frontend.schema import MaxTokens, Schema, Text, only, str_or_list

MAX_METADATA_KEYS = 16  # OpenAI's limits on metadata
MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 64, 512
ITEM_TYPES = ("message", "function_call", "function_call_output")


def _one_of(allowed: tuple[str, ...], what: str) -> AfterValidator:
    """A `type` field: one of `allowed`, else a 400 that names what we do not support."""
    shown = ", ".join(f'"{a}"' for a in allowed)

    def check(v: str) -> str:
        if v in allowed:
            return v
        context = {"what": what, "shown": shown}
        raise PydanticCustomError("unsupported", "{what}: only {shown}", context)

    return AfterValidator(check)


def _refused(reason: str) -> AfterValidator:
    def check(v: Any) -> Any:
        raise PydanticCustomError("unsupported", reason)

    return AfterValidator(check)


class TextPart(Schema):
    """A message's text: input_text (what a client writes), output_text (an earlier answer
    sent back as an item). Images, files and audio are refused by name."""

    type: Annotated[Text, _one_of(("input_text", "output_text"), "unsupported content part")]
    text: Text


Content = Annotated[
    Annotated[Text, Tag("<str>")] | Annotated[list[TextPart], Tag("<list>")],
    str_or_list("expected a string or an array of content parts"),
]


def _joined(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


class MessageItem(Schema):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Content

    def text(self) -> str:
        return _joined(self.content)


class FunctionCallItem(Schema):
    """A call the model made, sent back with the conversation."""

    type: Literal["function_call"]
    call_id: Text
    name: Text
    arguments: Text


class FunctionCallOutputItem(Schema):
    """The client's result of a call."""

    type: Literal["function_call_output"]
    call_id: Text
    output: Content

    def text(self) -> str:
        return _joined(self.output)


class OtherItem(Schema):
    """Any other item type (reasoning, web_search_call, item_reference, ...): refused."""

    type: Annotated[Any, _one_of(ITEM_TYPES, "unsupported item type")]


def _item_tag(v: Any) -> str | None:
    if not isinstance(v, dict):
        return None
    kind = v.get("type", "message")
    return f"<{kind}>" if kind in ITEM_TYPES else "<other>"


Item = Annotated[
    Annotated[MessageItem, Tag("<message>")]
    | Annotated[FunctionCallItem, Tag("<function_call>")]
    | Annotated[FunctionCallOutputItem, Tag("<function_call_output>")]
    | Annotated[OtherItem, Tag("<other>")],
    Discriminator(_item_tag, custom_error_type="type", custom_error_message="expected an item"),
]
Input = Annotated[
    Annotated[Text, Tag("<str>")] | Annotated[list[Item], Tag("<list>")],
    str_or_list("expected a string or an array of items"),
]
FUNCTION_ONLY = _one_of(("function",), "built-in tools are not supported")


class FunctionTool(Schema):
    """Checked further (name, parameters) by chat's tool parser, under this tool's path."""

    type: Annotated[Text, FUNCTION_ONLY]
    name: Any = None
    description: Any = None
    parameters: Any = None
    strict: Any = None


class NamedFunction(Schema):
    type: Annotated[Text, FUNCTION_ONLY]
    name: Text


def _choice_tag(v: Any) -> str | None:
    return "<str>" if isinstance(v, str) else "<dict>" if isinstance(v, dict) else None


ToolChoice = Annotated[
    Annotated[Literal["none", "auto", "required"], Tag("<str>")]
    | Annotated[NamedFunction, Tag("<dict>")],
    Discriminator(_choice_tag, custom_error_type="type",
                  custom_error_message='expected "none", "auto", "required" or a function'),
]  # fmt: skip


class TextConfig(Schema):
    format: dict[str, Any] | None = None  # checked as chat's response_format
    verbosity: Annotated[Any, only(None, "medium")] = None


class Reasoning(Schema):
    effort: Annotated[Any, only(None, "none")] = None  # the served models do not reason
    summary: Annotated[Any, only(None)] = None
    generate_summary: Annotated[Any, only(None)] = None


MetadataValue = Annotated[Text, Field(max_length=MAX_METADATA_VALUE_CHARS)]


def _metadata_keys(v: dict[str, str]) -> dict[str, str]:
    long = next((k for k in v if len(k) > MAX_METADATA_KEY_CHARS), None)
    if long is not None:
        raise PydanticCustomError("metadata", "keys must be at most {n} characters",
                                  {"n": MAX_METADATA_KEY_CHARS})  # fmt: skip
    return v


class ResponsesRequest(Schema):
    model: Text
    input: Input
    instructions: Text | None = None
    previous_response_id: Text | None = None
    max_output_tokens: MaxTokens | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    stream: bool | None = None
    store: bool | None = None  # default true: kept for previous_response_id and GET
    metadata: (
        Annotated[dict[str, MetadataValue], Field(max_length=MAX_METADATA_KEYS),
                  AfterValidator(_metadata_keys)] | None
    ) = None  # fmt: skip
    user: Text | None = None  # labels: echoed, never read
    safety_identifier: Text | None = None
    prompt_cache_key: Text | None = None  # every prompt is cached by prefix anyway
    max_tool_calls: Annotated[int, Field(ge=0)] | None = None  # OpenAI's: built-in tools only
    # what this server cannot do
    reasoning: Reasoning | None = None
    include: list[Annotated[Text, _refused("this server does not produce it")]] | None = None
    truncation: Annotated[Any, only(None, "disabled")] = None  # a long input is a 400
    top_logprobs: Annotated[Any, only(None, 0)] = None
    background: Annotated[Any, only(None, False)] = None
    background_options: Annotated[Any, only(None)] = None
    conversation: Annotated[Any, only(None)] = None  # the Conversations API is not served
    prompt: Annotated[Any, only(None)] = None  # stored prompt templates
    context_management: Annotated[Any, only(None, [])] = None
    moderation: Annotated[Any, only(None)] = None
    service_tier: Annotated[Any, only(None, "auto", "default")] = None
    prompt_cache_retention: Annotated[Any, only(None, "in_memory")] = None
