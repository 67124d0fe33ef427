"""A request body as JSON: the content type, size, nesting and encoding checked first.

    Content-Type not application/json (charset utf-8 or none)  -> 415
    more than MAX_BODY_BYTES                                    -> 413
    arrays/objects nested deeper than MAX_DEPTH, not UTF-8,
    not JSON                                                    -> 400

The depth is measured on the raw bytes before parsing (strings skipped, one linear pass),
so a body of 100,000 brackets never reaches a recursive parser.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
from aiohttp import hdrs, web

from trd.frontend.openai_api import ApiError, describe

MAX_BODY_BYTES = 4 << 20
MAX_DEPTH = 32
# A JSON string, or an unterminated one up to the end: possessive, so no backtracking.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"?', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def nesting_depth(raw: bytes) -> int:
    """How deep arrays and objects nest in a JSON text (brackets inside strings skipped)."""
    brackets = np.frombuffer(_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS), np.uint8)
    opens = (brackets == ord("[")) | (brackets == ord("{"))
    return int(np.cumsum(np.where(opens, 1, -1)).max(initial=0))


async def read_json(request: web.Request) -> Any:
    charset = (request.charset or "utf-8").lower()
    if request.content_type != "application/json" or charset not in ("utf-8", "utf8"):
        got = request.headers.get(hdrs.CONTENT_TYPE)
        raise ApiError(
            415, f"Content-Type must be application/json, got {describe(got) if got else 'none'}",
            code="unsupported_media_type",
        )  # fmt: skip
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes") from None
    depth = nesting_depth(raw)
    if depth > MAX_DEPTH:
        msg = f"arrays and objects nest {depth} deep, at most {MAX_DEPTH} levels are allowed"
        raise ApiError(400, f"the request body is too deep: {msg}")
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not UTF-8: {exc}") from None
    except ValueError as exc:  # bad syntax, or an integer of more than 4300 digits
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None
