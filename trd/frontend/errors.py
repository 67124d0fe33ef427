"""OpenAI's error body, and the words for a value in an error message.

{"error": {"message": "seed: must be less than or equal to 9223372036854775807,
           got 9223372036854775808", "type": "invalid_request_error",
           "param": "seed", "code": null}}
"""

from __future__ import annotations

import json
from typing import Any

_SHORT = 40  # characters of a value shown whole in an error message
_SIZED: dict[type, str] = {
    str: "a string of {} characters",
    list: "an array of {} items",
    dict: "an object of {} keys",
}


class ApiError(Exception):
    """An error response in OpenAI's shape: status, message, type, param and code."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        retry_after_s: int | None = None,  # sent as Retry-After, which the openai client honours
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = (
            status, message, param, code, type,
        )  # fmt: skip
        self.headers = {} if retry_after_s is None else {"Retry-After": str(retry_after_s)}

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.type, "param": self.param}
        return {"error": {**error, "code": self.code}}


def bad(param: str, message: str, code: str | None = None) -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code=code)


def describe(v: Any) -> str:
    """A value for an error message: whole (as JSON) when short, else its type and size."""
    sized = _SIZED.get(type(v))
    if sized is not None and len(v) > _SHORT:
        return sized.format(len(v))
    text = json.dumps(v)  # ASCII: a lone surrogate shows as its \ud800 escape
    if len(text) <= _SHORT:
        return text
    return sized.format(len(v)) if sized is not None else f"a number of {len(text)} digits"
