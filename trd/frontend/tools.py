"""Tool calling on chat: the tools a request offers, the grammar tool_choice asks for, and
the calls read back out of the model's text, in OpenAI's shapes.

    tool_choice  "none"      the template sees the tools; the text is the answer
                 "auto"      the template sees the tools; <tool_call>{"name": .., "arguments":
                             {..}}</tool_call> blocks in the text (Qwen's and Hermes' format)
                             become message.tool_calls, the text before them the content;
                             so does a whole output that is one such object, untagged
                 "required"  the output is a JSON array [{"name": .., "parameters": {..}}, ..]
                             constrained to the tools' schemas (as vLLM does), read as calls
                 named       {"type": "function", "function": {"name": f}}: the output is f's
                             arguments, constrained to f's parameters schema

The default is "auto" with tools and "none" without, as OpenAI's; parallel_tool_calls
false allows one call ("required": an array of at most one).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from trd.frontend.call_deltas import call_id
from trd.frontend.errors import bad, describe
from trd.frontend.structured import compiled

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Tools:
    specs: list[dict[str, Any]]  # as the chat template receives them: OpenAI's tool objects
    choice: str  # none | auto | required | named
    name: str = ""  # the named function
    parallel: bool = True  # OpenAI's parallel_tool_calls: false = at most one call

    def grammar(self) -> tuple[str, str, Any] | None:
        """The constraint tool_choice asks for, as (param, kind, value), or None."""
        if self.choice == "named":
            i = next(i for i, s in enumerate(self.specs) if s["function"]["name"] == self.name)
            return (
                f"tools[{i}].function.parameters",
                "json",
                _parameters(self.specs[i]["function"]),
            )
        if self.choice == "required":
            calls = [_call_schema(s["function"]) for s in self.specs]
            for i, spec in enumerate(self.specs):  # name the tool whose schema is refused
                compiled(f"tools[{i}].function.parameters", "json", _parameters(spec["function"]))
            schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
            schema |= {} if self.parallel else {"maxItems": 1}
            return ("tools", "json", schema)
        return None

    def calls(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The content and the tool calls in a finished output (OpenAI's message shape)."""
        if self.choice == "named":
            return None, [_call(self.name, text)]
        if self.choice == "required":
            try:
                items = json.loads(text)
                return None, [_call(c["name"], json.dumps(c["parameters"])) for c in items]
            except (ValueError, TypeError, KeyError):
                return text, []  # cut off by max_tokens: the text as it is
        if self.choice == "auto" and (bare := self._bare_call(text)) is not None:
            return None, [bare]
        if self.choice == "auto" and OPEN in text:
            head, calls = text[: text.index(OPEN)], []
            for block in _CALL.findall(text):
                try:
                    call = json.loads(block)
                    calls.append(_call(call["name"], json.dumps(call.get("arguments", {}))))
                except (ValueError, TypeError, KeyError):
                    return text, []  # not a call after all: the text is the answer
            return head.strip() or None, calls if self.parallel else calls[:1]
        return text, []

    def _bare_call(self, text: str) -> dict[str, Any] | None:
        """A whole output that is one {"name": a tool, "arguments": {..}} object without
        the <tool_call> tags (Qwen2.5-Coder often leaves them out), as a call."""
        if not text.lstrip().startswith("{"):
            return None
        try:
            call = json.loads(text)
        except ValueError:
            return None
        names = {s["function"]["name"] for s in self.specs}
        if not (isinstance(call, dict) and call.keys() == {"name", "arguments"}):
            return None
        if call["name"] not in names or not isinstance(call["arguments"], dict):
            return None
        return _call(call["name"], json.dumps(call["arguments"]))


def finish_reason(tools: Tools, calls: list[dict[str, Any]], reason: str) -> str:
    """OpenAI's: "tool_calls" when the model chose to call (auto, required); a named
    function's call ends with "stop"."""
    return "tool_calls" if calls and reason == "stop" and tools.choice != "named" else reason


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    """vLLM's item of a "required" array: {"name": the function, "parameters": its args}."""
    props = {"name": {"enum": [function["name"]]}, "parameters": _parameters(function)}
    return {"type": "object", "properties": props, "required": ["name", "parameters"],
            "additionalProperties": False}  # fmt: skip


def _parameters(function: dict[str, Any]) -> Any:
    return function.get("parameters") or {"type": "object"}


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id(), "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip


def parse_tools(tools: Any, tool_choice: Any, parallel: Any = None) -> Tools | None:
    """The request's tools, tool_choice and parallel_tool_calls, checked; None when it
    offers no tools."""
    if parallel is not None and not isinstance(parallel, bool):
        raise bad("parallel_tool_calls", f"must be a boolean, got {describe(parallel)}")
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise bad("tool_choice", f"needs tools, got {describe(tool_choice)}")
        return None
    if not isinstance(tools, list):
        raise bad("tools", f"must be an array of tools, got {describe(tools)}")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise bad(f"tools[{i}]", 'must be {"type": "function", "function": {...}}')
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad(f"tools[{i}].function.name", "must be a non-empty string")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise bad(f"tools[{i}].function.parameters", "must be a JSON schema object")
    names = [t["function"]["name"] for t in tools]
    if tool_choice is None or tool_choice in ("none", "auto", "required"):
        return Tools(tools, tool_choice or "auto", parallel=parallel is not False)
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise bad("tool_choice", 'must be "none", "auto", "required" or '
                  '{"type": "function", "function": {"name": ...}}')  # fmt: skip
    if name not in names:
        raise bad("tool_choice.function.name", f"{describe(name)} is not one of the tools")
    return Tools(tools, "named", name, parallel is not False)
