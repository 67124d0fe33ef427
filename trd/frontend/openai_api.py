"""OpenAI request bodies -> validated `GenRequest`s; every mistake is an `ApiError`.

Accepted (completions / chat.completions): model, prompt (a string, token ids, or a list
holding one of those) / messages, max_tokens (+ max_completion_tokens for chat),
temperature, top_p, top_k, seed, stop (strings), stop_token_ids, ignore_eos, n=1,
stream, stream_options.include_usage. Fields OpenAI defines that we do not implement
are accepted only at their no-op value; anything else is rejected by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trd.protocol import SamplingParams

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
# Fields of OpenAI's API that are harmless at these values (clients often send them).
_NOOP_FIELDS: dict[str, tuple[Any, ...]] = {
    "user": (),  # any string: only an end-user label
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "store": (None, False),
    "metadata": (None, {}),
}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n",
           "stop_token_ids", "ignore_eos", "stream", "stream_options"}  # fmt: skip
_ROLES = ("system", "developer", "user", "assistant")


class ApiError(Exception):
    """An error response in OpenAI's shape: status, message, type, param and code."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status, message, param, code, type,
        )  # fmt: skip

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param}
        return {"error": {**error, "code": self.code}}


def bad(param: str, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code=code)


@dataclass(frozen=True, slots=True)
class GenRequest:
    chat: bool
    prompt: str | list[int] | None  # completions
    messages: list[dict[str, str]] | None  # chat, contents flattened to strings
    max_tokens: int | None  # None: as many as the context leaves (chat default)
    params: SamplingParams  # max_tokens is filled in once the prompt length is known
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise bad(key, f"expected a number, got {v!r:.50}")
    if not low <= v <= high:
        raise bad(key, f"must be in [{low:g}, {high:g}], got {v!r}")
    return float(v)


def _int(body: dict[str, Any], key: str, low: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not _is_int(v):
        raise bad(key, f"expected an integer, got {v!r:.50}")
    if v < low:
        raise bad(key, f"must be >= {low}, got {v}")
    return int(v)


def _token_ids(key: str, v: Any, vocab_size: int, limit: int | None = None) -> list[int]:
    if not isinstance(v, list) or not all(_is_int(t) for t in v):
        raise bad(key, f"expected a list of token ids, got {v!r:.50}")
    if limit is not None and len(v) > limit:
        raise bad(key, f"at most {limit} token ids are allowed, got {len(v)}")
    out_of_range = [t for t in v if not 0 <= t < vocab_size]
    if out_of_range:
        raise bad(key, f"token ids must be in [0, {vocab_size}), got {out_of_range[:5]}")
    return list(v)


def _top_p(body: dict[str, Any]) -> float:
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise bad("top_p", "must be in (0, 1], got 0")
    return top_p


def _stop(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop", f"expected a string or a list of strings, got {v!r:.50}")
    if len(stops) > MAX_STOP_STRINGS:
        raise bad("stop", f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stops)}")
    if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
        raise bad("stop", f"stop strings must have 1 to {MAX_STOP_CHARS} characters")
    return tuple(stops)


def _check_fields(body: dict[str, Any], allowed: set[str]) -> None:
    for key, value in body.items():
        if key in allowed:
            continue
        if key in _NOOP_FIELDS:
            noop = _NOOP_FIELDS[key]
            if not noop or any(value == n and type(value) is type(n) for n in noop):
                continue
            raise bad(key, f"only {noop[-1]!r} is supported, got {value!r:.50}")
        raise bad(key, "unrecognized request argument")


def _common(body: dict[str, Any], vocab_size: int, max_tokens_key: str) -> dict[str, Any]:
    if _int(body, "n", 1) not in (None, 1):
        raise bad("n", "only n=1 is supported")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad("stream", f"expected a boolean, got {stream!r:.50}")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad("stream_options", "only allowed when stream is true")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise bad("stream_options", f"expected {{'include_usage': bool}}, got {options!r:.50}")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise bad("stream_options.include_usage", f"expected a boolean, got {include_usage!r}")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise bad("ignore_eos", f"expected a boolean, got {ignore_eos!r:.50}")
    stop_ids = body.get("stop_token_ids")
    top_k = _int(body, "top_k", -1)
    return {
        "max_tokens": _int(body, max_tokens_key, 1),
        "stop": _stop(body.get("stop")),
        "stream": bool(stream),
        "include_usage": include_usage,
        "params": SamplingParams(
            max_tokens=1,  # placeholder until the prompt length is known
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_top_p(body),
            top_k=0 if top_k in (None, -1) else top_k,
            seed=_int(body, "seed", 0),
            stop_token_ids=tuple(
                _token_ids("stop_token_ids", stop_ids, vocab_size, MAX_STOP_TOKEN_IDS)
                if stop_ids is not None
                else ()
            ),
            ignore_eos=ignore_eos,
        ),
    }


def _model(body: dict[str, Any], served: str) -> None:
    model = body.get("model")
    if not isinstance(model, str):
        raise bad("model", f"required, a string naming the model ({served!r})")
    if model != served:
        raise ApiError(
            404, f"the model {model!r} does not exist; this server serves {served!r}",
            param="model", code="model_not_found",
        )  # fmt: skip


def parse_completion(body: Any, served: str, vocab_size: int) -> GenRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    _check_fields(body, _COMMON | {"prompt"})
    _model(body, served)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, str | list) for p in prompt):
            raise bad("prompt", "only one prompt per request is supported")
        prompt = _token_ids("prompt", prompt, vocab_size)
    elif not isinstance(prompt, str):
        raise bad("prompt", f"expected a string or a list of token ids, got {prompt!r:.50}")
    if not prompt:
        raise bad("prompt", "must not be empty")
    common = _common(body, vocab_size, "max_tokens")
    # OpenAI's completions default: 16 tokens.
    common["max_tokens"] = common["max_tokens"] or 16
    return GenRequest(chat=False, prompt=prompt, messages=None, **common)


def _content(i: int, content: Any) -> str:
    if isinstance(content, str):
        return content
    # The parts form: [{"type": "text", "text": "..."}, ...]; only text parts are served.
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise bad(f"messages[{i}].content", "expected a string or a list of text parts")


def parse_chat(body: Any, served: str, vocab_size: int) -> GenRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    _check_fields(body, _COMMON | {"messages", "max_completion_tokens"})
    _model(body, served)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "expected a non-empty list of messages")
    flat = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise bad(f"messages[{i}]", f"expected {{'role': one of {_ROLES}, 'content': ...}}")
        flat.append({"role": m["role"], "content": _content(i, m.get("content"))})
    common = _common(body, vocab_size, "max_tokens")
    newer = _int(body, "max_completion_tokens", 1)
    common["max_tokens"] = newer if newer is not None else common["max_tokens"]
    return GenRequest(chat=True, prompt=None, messages=flat, **common)
