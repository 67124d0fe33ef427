"""Tools in the chat template: what the template receives, and a fallback for templates
that do not know tools.

A call's arguments become an object (templates write them with `tojson`; clients send a
JSON string). A template that never mentions tools (the tiny fixtures') gets them in
Qwen2.5's own words instead: a system message listing them, each earlier call as its
<tool_call> block in the assistant's text, each result in a <tool_response> block of a
user turn, so the model sees what Qwen's template would have shown it.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from trd.frontend.tools import CLOSE, OPEN


def template_messages(
    messages: list[dict[str, Any]], specs: list[dict[str, Any]] | None, template: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and tools (None: not passed) as the chat template gets them."""
    out = [_with_object_arguments(m) for m in messages]
    if "tools" in template or not (specs or any(m.get("tool_calls") for m in out)):
        return out, specs
    plain = [_plain(m) for m in out]
    if specs:
        listed = "\n".join(json.dumps(t) for t in specs)
        intro = TOOLS_PROMPT.format(tools=listed)
        if plain and plain[0]["role"] == "system":
            plain[0] = {"role": "system", "content": plain[0]["content"] + "\n\n" + intro}
        else:
            plain.insert(0, {"role": "system", "content": intro})
    return plain, None


TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n{tools}\n</tools>\n\nFor each function call, return a json object with "
    "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def _with_object_arguments(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for call in calls:
        fn = dict(call.get("function") or {})
        if isinstance(fn.get("arguments"), str):
            with contextlib.suppress(ValueError):  # not JSON: the template writes the string
                fn["arguments"] = json.loads(fn["arguments"])
        fixed.append({**call, "function": fn})
    return {**message, "tool_calls": fixed}


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """A message as plain text, for a template that knows only role and content."""
    if message["role"] == "tool":
        return {
            "role": "user",
            "content": f"<tool_response>\n{message['content']}\n</tool_response>",
        }
    calls = [c["function"] for c in message.get("tool_calls") or []]
    blocks = [
        f"{OPEN}\n{json.dumps({'name': f.get('name'), 'arguments': f.get('arguments')})}\n{CLOSE}"
        for f in calls
    ]
    content = "\n".join([message.get("content") or "", *blocks]).strip()
    return {"role": message["role"], "content": content}
