"""The request schema of /v1/completions and /v1/chat/completions, declared once.

Every integer limit comes from the width its field has on the wire to the engines
(`trd.protocol.PARAMS_LAYOUT`), so a request accepted here always encodes. Besides
OpenAI's fields we accept vLLM's extensions that real clients send (top_k, min_tokens,
ignore_eos, stop_token_ids, include_stop_str_in_output, return_token_ids,
stream_options.continuous_usage_stats, and for chat add_generation_prompt,
continue_final_message, chat_template_kwargs). The structured-output and tool fields
(response_format, structured_outputs, guided_*, tools, tool_choice) are typed loosely here
and checked, with the grammar library, in `structured` and `tools`.
Fields we cannot honour, OpenAI's or vLLM's, are accepted only at their no-op value
(best_of=1, echo=false, min_p=0, ...): a client that asks for them gets a
400 rather than an answer that silently lacks them. Fields we do not know are ignored,
as OpenAI's API does. Strict types: 2.0 is not an
integer, "1" is not a number, 1 is not a boolean.

Unions are tagged by a function of the JSON type, so a mistake gives one error in one
branch; tags are written "<...>" and left out of the field path shown to the client.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from annotated_types import Interval
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError

from trd.protocol import MAX_LOGPROBS, PARAMS_LAYOUT, TOKEN_ID, int_range

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_CHOICES = 128  # OpenAI's limit on n


def wire_range(field: str, low: int | None = None) -> Interval:
    """The values `field` takes: up to its wire width's maximum, from `low` if given."""
    lo, hi = int_range(PARAMS_LAYOUT[field])
    return Interval(ge=lo if low is None else low, le=hi)


def _valid_unicode(v: Any) -> Any:
    # json.loads turns "\ud800" into a lone surrogate, which no encoder accepts later.
    if isinstance(v, str) and not v.isascii():
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise PydanticCustomError(
                "unicode",
                "must be valid Unicode, but has a lone surrogate ({char}) at index {index}",
                {"char": f"U+{ord(v[e.start]):04X}", "index": e.start},
            ) from None
    return v


def _in_vocab(ids: list[int], info: ValidationInfo) -> list[int]:
    vocab = (info.context or {})["vocab_size"]
    if ids and max(ids) >= vocab:  # max() first: a prompt may hold a million ids
        bad = next(i for i, t in enumerate(ids) if t >= vocab)
        raise PydanticCustomError(
            "token_id",
            "token id {token} at index {index} is outside the vocabulary [0, {vocab})",
            {"vocab": vocab, "token": ids[bad], "index": bad},
        )
    return ids


def only(*allowed: Any) -> AfterValidator:
    """A field we cannot honour: only these values (of these JSON types) are accepted."""
    shown = " or ".join(json.dumps(a) for a in allowed)

    def check(v: Any) -> Any:
        if any(v == a and type(v) is type(a) for a in allowed):
            return v
        raise PydanticCustomError("unsupported", "only {allowed} is supported", {"allowed": shown})

    return AfterValidator(check)


def _json_type(v: Any) -> str | None:
    return "<str>" if isinstance(v, str) else "<list>" if isinstance(v, list) else None


def str_or_list(expected: str) -> Discriminator:
    """A union of a string form ("<str>") and an array form ("<list>"): one is validated."""
    return Discriminator(_json_type, custom_error_type="type", custom_error_message=expected)


def _one_prompt(v: Any) -> Any:
    """A batch of one prompt is that prompt; a batch of several is refused by name."""
    if isinstance(v, list) and v and all(isinstance(p, str | list) for p in v):
        if len(v) > 1:
            raise PydanticCustomError("batch", "only one prompt per request is supported")
        return v[0]
    return v


UNICODE, IN_VOCAB = BeforeValidator(_valid_unicode), AfterValidator(_in_vocab)
Text = Annotated[str, UNICODE]
TokenId = Annotated[int, Interval(ge=0, le=int_range(TOKEN_ID)[1])]
TokenIds = Annotated[list[TokenId], Field(min_length=1, fail_fast=True), IN_VOCAB]
StopText = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS), UNICODE]
Stop = Annotated[
    Annotated[StopText, Tag("<str>")]
    | Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS), Tag("<list>")],
    str_or_list("expected a string or an array of strings"),
]
Prompt = Annotated[
    Annotated[str, Field(min_length=1), UNICODE, Tag("<str>")] | Annotated[TokenIds, Tag("<list>")],
    str_or_list("expected a string or an array of token ids"),
    BeforeValidator(_one_prompt),
]
MaxTokens = Annotated[int, wire_range("max_tokens", low=1)]


class Schema(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, frozen=True)


class StreamOptions(Schema):
    include_usage: bool | None = None  # a last chunk with the usage
    continuous_usage_stats: bool | None = None  # the usage so far in every chunk (vLLM)


class TextPart(Schema):
    type: Literal["text"]
    text: Text


Content = Annotated[
    Annotated[Text, Tag("<str>")] | Annotated[list[TextPart], Tag("<list>")],
    str_or_list("expected a string or an array of text parts"),
]


class ChatMessage(Schema):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None  # None: an assistant turn that only calls tools
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls
    tool_call_id: Text | None = None  # a tool result: the call it answers

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)


class Routing(Schema):
    """Our per-request routing (`extra_body={"routing": {...}}` in the openai client): at
    most one of the three. What depends on the daemon (a policy with a threshold, the
    threshold's scale, the model names) is checked by trd.frontend.routing."""

    model_config = ConfigDict(extra="forbid")  # a misspelt key must not route silently

    large_share: Annotated[float, Interval(gt=0, lt=1)] | None = None  # held within the request
    threshold: Annotated[float, Interval(ge=0)] | None = None  # the policy's, for this request
    model: Text | None = None  # the model that writes every token

    @model_validator(mode="after")
    def _one(self) -> Routing:
        given = [k for k in ("large_share", "threshold", "model") if getattr(self, k) is not None]
        if len(given) > 1:
            raise PydanticCustomError(
                "routing", "takes one of large_share, threshold and model, got {given}",
                {"given": " and ".join(given)},
            )  # fmt: skip
        return self


class RoutingFields(Schema):
    """How a request is served, on every endpoint that generates (chat, completions,
    responses): its own routing, and vLLM's `priority` (lower first, default 0; ties by
    arrival) in every engine's queue. trd.frontend.routing turns them into the engines'
    RoutingParams and priority."""

    routing: Routing | None = None
    priority: Annotated[int, wire_range("priority")] | None = None


class GenerationRequest(RoutingFields):
    """The fields both endpoints share."""

    model: Text
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None  # OpenAI's newer name; wins over max_tokens
    min_tokens: Annotated[int, wire_range("min_tokens")] | None = None
    temperature: Annotated[float, Interval(ge=0, le=2)] | None = None
    top_p: Annotated[float, Interval(gt=0, le=1)] | None = None
    top_k: Annotated[int, wire_range("top_k", low=-1)] | None = None  # -1 and 0: off
    seed: Annotated[int, wire_range("seed", low=0)] | None = None  # -1 is None on the wire
    stop: Stop | None = None
    stop_token_ids: (
        Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS), IN_VOCAB] | None
    ) = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None  # vLLM's: the text keeps the stop string
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = None  # vLLM's: output ids (and, ours, each one's model)
    user: Text | None = None  # an end-user label; only checked
    n: Annotated[int, Interval(ge=1, le=MAX_CHOICES)] | None = None  # choices, each its own run
    best_of: Annotated[Any, only(None, 1)] = None
    echo: Annotated[Any, only(None, False)] = None
    suffix: Annotated[Any, only(None, "")] = None
    presence_penalty: Annotated[Any, only(None, 0, 0.0)] = None
    frequency_penalty: Annotated[Any, only(None, 0, 0.0)] = None
    repetition_penalty: Annotated[Any, only(None, 1, 1.0)] = None
    logit_bias: Annotated[Any, only(None, {})] = None
    tools: Any = None  # trd.frontend.tools (chat only)
    tool_choice: Any = None
    response_format: Any = None  # trd.frontend.structured, as the vLLM fields below
    # vLLM's extensions that change the output
    min_p: Annotated[Any, only(None, 0, 0.0)] = None
    use_beam_search: Annotated[Any, only(None, False)] = None
    length_penalty: Annotated[Any, only(None, 1, 1.0)] = None
    prompt_logprobs: Annotated[Any, only(None)] = None
    allowed_token_ids: Annotated[Any, only(None)] = None
    bad_words: Annotated[Any, only(None, [])] = None
    logits_processors: Annotated[Any, only(None)] = None
    skip_special_tokens: Annotated[Any, only(None, True)] = None
    spaces_between_special_tokens: Annotated[Any, only(None, True)] = None
    truncate_prompt_tokens: Annotated[Any, only(None)] = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structural_tag: Annotated[Any, only(None)] = None
    structured_outputs: Any = None


Logprobs = Annotated[int, Interval(ge=0, le=MAX_LOGPROBS)]


class CompletionRequest(GenerationRequest):
    prompt: Prompt
    logprobs: Logprobs | None = None  # the chosen token's and this many alternatives'


# apply_chat_template's own arguments and the names it gives the template: not for clients
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation",
    "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs",
})  # fmt: skip


def _template_kwargs(v: dict[str, Any]) -> dict[str, Any]:
    for key in v:
        if not key.isidentifier() or key in RESERVED_TEMPLATE_KWARGS:
            raise PydanticCustomError(
                "template_kwarg",
                "{key} cannot be passed to the chat template",
                {"key": json.dumps(key)},
            )
    return v


class ChatFields(Schema):
    """The messages and how the chat template renders them (vLLM's fields besides OpenAI's)."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, fail_fast=True)]
    add_generation_prompt: bool | None = None  # vLLM's; default true
    continue_final_message: bool | None = None  # vLLM's: the reply extends the last message
    chat_template_kwargs: Annotated[dict[str, Any], AfterValidator(_template_kwargs)] | None = (
        None  # vLLM's: extra template variables, e.g. {"enable_thinking": false} for Qwen3
    )
    chat_template: Annotated[Any, only(None)] = None


class ChatRequest(GenerationRequest, ChatFields):
    logprobs: bool | None = None
    top_logprobs: Logprobs | None = None  # alternatives per token; needs logprobs true


# vLLM's /tokenize (a prompt or a chat) and /detokenize; the model is optional there.
class TokenizeText(Schema):
    model: Text | None = None
    prompt: Text
    add_special_tokens: bool | None = None  # default true, as vLLM's


class TokenizeChat(ChatFields):
    model: Text | None = None
    add_special_tokens: bool | None = None  # default false: the template writes them


class DetokenizeRequest(Schema):
    model: Text | None = None
    tokens: TokenIds
