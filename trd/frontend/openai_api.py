"""OpenAI request bodies -> `GenRequest`s through the schema; every mistake is an `ApiError`.

The fields and their limits are declared in `trd.frontend.schema`; this module turns
a validated request into what the front end serves, and a validation error into
OpenAI's error body, whose message names the field, the reason and the value:

    {"error": {"message": "seed: must be less than or equal to 9223372036854775807,
               got 9223372036854775808", "type": "invalid_request_error",
               "param": "seed", "code": null}}
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from trd.frontend.errors import ApiError, bad, describe
from trd.frontend.schema import (
    ChatFields,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    GenerationRequest,
    StreamOptions,
    TokenizeChat,
    TokenizeText,
)
from trd.frontend.structured import request_grammar
from trd.frontend.tools import Tools, parse_tools
from trd.protocol import GREEDY_BELOW, NO_ROUTING, RoutingParams, SamplingParams

log = logging.getLogger("trd.frontend")

COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat: the context left
R = TypeVar("R", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class ChatTemplateArgs:
    """How a chat's messages become its prompt (vLLM's request fields)."""

    add_generation_prompt: bool = True  # open the assistant's turn
    continue_final_message: bool = False  # the reply extends the last message instead
    variables: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs
    tools: list[dict[str, Any]] | None = None  # the tools offered, OpenAI's objects


@dataclass(frozen=True, slots=True)
class GenRequest:
    chat: bool
    prompt: str | list[int] | None  # completions
    messages: list[dict[str, Any]] | None  # chat, contents flattened to strings
    max_tokens: int | None  # None: as many as the context leaves (chat default)
    max_tokens_param: str  # the field max_tokens came from, for errors
    stop: tuple[str, ...]
    keep_stop: bool  # include_stop_str_in_output
    stream: bool
    include_usage: bool  # a last chunk with the usage
    continuous_usage: bool  # the usage so far in every chunk
    return_token_ids: bool  # each choice carries its token ids and producing models
    n: int  # choices
    source: GenerationRequest  # the request's sampling fields, which `params` reads
    template: ChatTemplateArgs = field(default_factory=ChatTemplateArgs)
    tools: Tools | None = None  # chat: the tools offered and tool_choice
    logprobs: int | None = None  # alternatives per output token
    grammar: str = ""  # the structured-output constraint, compiled by the engines

    def params(self, max_tokens: int, routing: RoutingParams = NO_ROUTING) -> SamplingParams:
        """The engines' parameters, once the prompt fixed how many tokens may come and the
        daemon checked the request's `routing` (trd.frontend.routing)."""
        req = self.source
        temperature = 1.0 if req.temperature is None else req.temperature
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature if temperature >= GREEDY_BELOW else 0.0,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=max(req.top_k or 0, 0),  # -1 (vLLM) and 0 (ours) both mean off
            seed=req.seed,
            stop_token_ids=tuple(req.stop_token_ids or ()),
            ignore_eos=bool(req.ignore_eos),
            min_tokens=req.min_tokens or 0,
            logprobs=self.logprobs,
            grammar=self.grammar,
            routing=routing,
            priority=req.priority or 0,
        )


def _param(loc: tuple[int | str, ...]) -> str:
    """("messages", 0, "content") -> "messages[0].content"; union tags ("<str>") left out."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.startswith("<"):
            out += f".{part}" if out else part
    return out


def _api_error(exc: ValidationError) -> ApiError:
    first = exc.errors(include_url=False, include_context=False)[0]
    param = _param(first["loc"])  # never empty: the body is a dict, so errors are in fields
    if first["type"] == "missing":
        return bad(param, "required")
    reason = first["msg"].replace("Input should be", "must be", 1)
    return bad(param, f"{reason}, got {describe(first['input'])}")


def validate(schema: type[R], body: Any, vocab_size: int) -> R:
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {describe(body)}")
    try:
        req = schema.model_validate(body, context={"vocab_size": vocab_size})
    except ValidationError as exc:
        raise _api_error(exc) from None
    unknown = [describe(k) for k in body if k not in schema.model_fields]
    if unknown:
        log.debug("ignoring unknown request fields: %s", ", ".join(unknown))
    return req


def check_model(model: str, served: str) -> None:
    if model != served:
        msg = f"{describe(model)} does not exist; this server serves {describe(served)}"
        raise ApiError(404, f"model: {msg}", param="model", code="model_not_found")


def _gen(
    req: GenerationRequest,
    default_max: int | None,
    prompt: str | list[int] | None = None,
    messages: list[dict[str, Any]] | None = None,
    template: ChatTemplateArgs | None = None,
    logprobs: int | None = None,
    grammar: str = "",
    tools: Tools | None = None,
) -> GenRequest:
    if req.stream_options is not None and not req.stream:
        raise bad("stream_options", "only allowed when stream is true")
    options = req.stream_options or StreamOptions()
    max_tokens = next(
        (m for m in (req.max_completion_tokens, req.max_tokens) if m is not None), default_max
    )
    max_param = "max_tokens" if req.max_completion_tokens is None else "max_completion_tokens"
    min_tokens = req.min_tokens or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise bad("min_tokens", f"must be at most {max_param} ({max_tokens}), got {min_tokens}")
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return GenRequest(
        chat=messages is not None, prompt=prompt, messages=messages, max_tokens=max_tokens,
        max_tokens_param=max_param, stop=stop,
        keep_stop=bool(req.include_stop_str_in_output), stream=bool(req.stream),
        include_usage=bool(options.include_usage),
        continuous_usage=bool(options.continuous_usage_stats),
        return_token_ids=bool(req.return_token_ids), n=req.n or 1, source=req,
        template=template or ChatTemplateArgs(), tools=tools, logprobs=logprobs,
        grammar=grammar,
    )  # fmt: skip


def parse_completion(body: Any, served: str, vocab_size: int) -> GenRequest:
    req = validate(CompletionRequest, body, vocab_size)
    check_model(req.model, served)
    if parse_tools(body.get("tools"), body.get("tool_choice")) is not None:
        raise bad("tools", "only /v1/chat/completions calls tools")
    grammar = request_grammar(body, None)
    return _gen(
        req, COMPLETIONS_MAX_TOKENS, prompt=req.prompt, logprobs=req.logprobs, grammar=grammar
    )


def parse_chat(body: Any, served: str, vocab_size: int) -> GenRequest:
    req = validate(ChatRequest, body, vocab_size)
    check_model(req.model, served)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad("top_logprobs", "needs logprobs to be true")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    tools = parse_tools(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
    grammar = request_grammar(body, tools.grammar() if tools is not None else None)
    template = replace(_template(req), tools=tools.specs if tools is not None else None)
    return _gen(req, None, messages=_messages(req), template=template, logprobs=logprobs,
                grammar=grammar, tools=tools)  # fmt: skip


def _messages(req: ChatFields) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, m in enumerate(req.messages):
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise bad(f"messages[{i}].content", "required (null only with tool_calls)")
        msg: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.tool_calls is not None:
            msg["tool_calls"] = m.tool_calls
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def _template(req: ChatFields) -> ChatTemplateArgs:
    continue_final = bool(req.continue_final_message)
    add_prompt = req.add_generation_prompt
    if add_prompt is None:  # vLLM's default is true; continuing a message implies false
        add_prompt = not continue_final
    if continue_final and add_prompt:
        raise bad("continue_final_message", "cannot be true while add_generation_prompt is true")
    return ChatTemplateArgs(add_prompt, continue_final, req.chat_template_kwargs or {})


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    """vLLM's /tokenize: a text (`prompt`) or a chat (`messages` and `template`)."""

    prompt: str | None
    messages: list[dict[str, Any]] | None
    template: ChatTemplateArgs
    add_special_tokens: bool


def parse_tokenize(body: Any, served: str, vocab_size: int) -> TokenizeRequest:
    if isinstance(body, dict) and "messages" in body:
        chat = validate(TokenizeChat, body, vocab_size)
        _check_optional_model(chat.model, served)
        special = bool(chat.add_special_tokens)
        return TokenizeRequest(None, _messages(chat), _template(chat), special)
    text = validate(TokenizeText, body, vocab_size)
    _check_optional_model(text.model, served)
    special = text.add_special_tokens is not False
    return TokenizeRequest(text.prompt, None, ChatTemplateArgs(), special)


def parse_detokenize(body: Any, served: str, vocab_size: int) -> list[int]:
    req = validate(DetokenizeRequest, body, vocab_size)
    _check_optional_model(req.model, served)
    return req.tokens


def _check_optional_model(model: str | None, served: str) -> None:
    if model is not None:
        check_model(model, served)
