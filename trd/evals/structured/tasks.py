"""The 50 tasks of `tokenrouterd eval structured`: JSON schemas (nested objects, enums,
arrays, bounded numbers), regexes, choices, and tool calls with 1-3 functions.

Each task is a chat request's extra fields (the constraint) with a checker of its answer:
its text, or its tool calls as {"name", "arguments"} read from the stream.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False, **extra}  # fmt: skip


KINDS = ("json", "regex", "choice", "tool")
S = {"type": "string", "maxLength": 40}
PERSON = _obj(
    {
        "name": S,
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["engineer", "manager", "designer"]},
        "address": _obj({"city": S, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}),
    }
)
PRODUCT = _obj(
    {
        "title": S,
        "price": {"type": "number", "minimum": 0, "maximum": 10000},
        "tags": {"type": "array", "items": {"enum": ["new", "sale", "eco", "gift"]}, "maxItems": 3},
        "in_stock": {"type": "boolean"},
    }
)
EVENT = _obj(
    {
        "name": S,
        "day": {"type": "string", "pattern": "^2026-[01][0-9]-[0-3][0-9]$"},
        "speakers": {
            "type": "array",
            "maxItems": 3,
            "items": _obj({"name": S, "minutes": {"type": "integer", "minimum": 5, "maximum": 60}}),
        },
    }
)
FUNC = _obj(
    {
        "name": {"type": "string", "pattern": "^[a-z_][a-z0-9_]{0,30}$"},
        "args": {
            "type": "array",
            "maxItems": 4,
            "items": _obj({"name": S, "type": {"enum": ["int", "str", "float", "list", "dict"]}}),
        },
        "returns": {"enum": ["int", "str", "float", "list", "dict", "None"]},
    }
)
SCHEMAS = {"person": PERSON, "product": PRODUCT, "event": EVENT, "function": FUNC}
SUBJECTS = {
    "person": ["a backend engineer in Berlin", "a product manager in Austin", "a designer "
               "in Lyon", "a retired engineer in Boston", "a young manager in Denver"],
    "product": ["a bamboo toothbrush", "a gaming laptop on sale", "a gift mug",
                "a solar charger", "a wool sweater"],
    "event": ["a Python meetup in March", "a two-talk security workshop", "a compiler "
              "conference day", "a data science evening", "a Rust hack night"],
    "function": ["reversing a string", "merging two sorted lists", "computing a mean",
                 "counting words in a text", "parsing a CSV line"],
}  # fmt: skip
REGEXES = [
    ("Today's date in ISO format", r"2026-[01][0-9]-[0-3][0-9]"),
    ("A US phone number", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"),
    ("A CSS hex colour for navy blue", r"#[0-9a-f]{6}"),
    ("The semantic version after 1.4.2", r"[0-9]{1,2}\.[0-9]{1,2}\.[0-9]{1,2}"),
    ("A private IPv4 address", r"(10|192)\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}"),
    ("An email address for Ada at example.com", r"[a-z]{1,12}@example\.com"),
    ("A time of day, 24-hour clock", r"[0-2][0-9]:[0-5][0-9]"),
    ("A Python variable name for a user count", r"[a-z_][a-z0-9_]{0,20}"),
    ("A three-letter currency code", r"[A-Z]{3}"),
    ("A git short hash", r"[0-9a-f]{7}"),
]
CHOICES = [
    ("Sentiment of 'I love this library'", ["positive", "negative", "neutral"]),
    ("Language of 'print(1)'", ["python", "javascript", "rust", "go"]),
    ("Is 17 prime?", ["yes", "no"]),
    ("Which is a sorting algorithm?", ["quicksort", "dijkstra", "bfs"]),
    ("HTTP method to create a resource", ["GET", "POST", "DELETE"]),
    ("Complexity of binary search", ["O(1)", "O(log n)", "O(n)"]),
    ("Which keyword defines a function in Python?", ["def", "func", "fn", "function"]),
    ("Sentiment of 'the build broke again'", ["positive", "negative", "neutral"]),
    ("Is JSON a binary format?", ["yes", "no"]),
    ("Which port does HTTPS use by default?", ["80", "443", "8080"]),
]
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": _obj({"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}}),
}
SEARCH = {
    "name": "search_docs",
    "description": "Search the documentation",
    "parameters": _obj({"query": S, "limit": {"type": "integer", "minimum": 1, "maximum": 20}}),
}
TICKET = {"name": "open_ticket", "description": "Open a support ticket", "parameters":
          _obj({"title": S, "priority": {"enum": ["low", "high"]}})}  # fmt: skip
TOOL_ASKS = [
    ("What's the weather in Paris, in celsius?", [WEATHER], "required"),
    ("Find docs about retries, 5 results.", [SEARCH, WEATHER], "required"),
    ("Open a high-priority ticket: login fails.", [TICKET, SEARCH, WEATHER], "required"),
    ("Weather in Tokyo in fahrenheit?", [WEATHER, TICKET], "required"),
    ("Search the docs for 'streaming'.", [SEARCH], "required"),
    ("Weather in Oslo?", [WEATHER, SEARCH], "get_weather"),
    ("Docs on rate limits, 3 results.", [SEARCH, TICKET, WEATHER], "search_docs"),
    ("File a low-priority ticket about typos.", [TICKET], "open_ticket"),
    ("Is it raining in Lima?", [WEATHER, SEARCH, TICKET], "get_weather"),
    ("Search for 'tool calling'.", [SEARCH, WEATHER], "search_docs"),
]


@dataclass(frozen=True)
class Task:
    kind: str  # of KINDS
    prompt: str
    extra: dict[str, Any]  # the request body's constraint fields
    spec: Any  # the schema, regex, choices or functions the answer is checked against

    def valid(self, content: str | None, calls: list[dict[str, str]]) -> bool:
        try:
            if self.kind == "json":
                jsonschema.validate(json.loads(content or ""), self.spec)
            elif self.kind == "regex":
                return re.fullmatch(self.spec, content or "") is not None
            elif self.kind == "choice":
                return content in self.spec
            else:
                params = {f["name"]: f["parameters"] for f in self.spec}
                if not calls:
                    return False
                for call in calls:
                    jsonschema.validate(json.loads(call["arguments"]), params[call["name"]])
            return True
        except (ValueError, jsonschema.ValidationError, KeyError):
            return False


def tasks() -> list[Task]:
    out = []
    for kind, subjects in SUBJECTS.items():
        fmt = {"type": "json_schema", "json_schema": {"name": kind, "schema": SCHEMAS[kind]}}
        out += [Task("json", f"Describe {s} as JSON.", {"response_format": fmt}, SCHEMAS[kind])
                for s in subjects]  # fmt: skip
    out += [Task("regex", f"{p}. Answer with it only.", {"structured_outputs": {"regex": r}}, r)
            for p, r in REGEXES]  # fmt: skip
    out += [Task("choice", q, {"guided_choice": c}, c) for q, c in CHOICES]
    for ask, fns, choice in TOOL_ASKS:
        tool_choice = (
            choice if choice == "required" else {"type": "function", "function": {"name": choice}}
        )
        extra = {"tools": [{"type": "function", "function": f} for f in fns],
                 "tool_choice": tool_choice, "parallel_tool_calls": False}  # fmt: skip
        out.append(Task("tool", ask, extra, fns))
    return out
