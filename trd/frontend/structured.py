"""Structured outputs in a request -> the grammar its output follows (SamplingParams.grammar).

    response_format   {"type": "json_object"}
                      {"type": "json_schema", "json_schema": {"name": .., "schema": {..}}}
    structured_outputs {"json": schema} | {"regex": ".."} | {"choice": [..]} | {"grammar": ".."}
    guided_json / guided_regex / guided_choice / guided_grammar   (vLLM's older names)
    tool_choice "required" or a named function (chat; `trd.frontend.tools`)

At most one of them constrains a request. Each becomes an llguidance grammar
(`trd.grammar.compile`) that the library must accept, else a 400 naming the field and
quoting the library's refusal: `response_format.json_schema.schema: the grammar library
refuses it: Invalid type: foo`.
"""

from __future__ import annotations

from typing import Any

from llguidance import LLMatcher

from trd.frontend.errors import bad, describe
from trd.grammar.compile import GrammarError, grammar_for

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "grammar"}  # fmt: skip
STRUCTURED_KINDS = ("json", "regex", "choice", "grammar")


def compiled(param: str, kind: str, value: Any) -> str:
    """The grammar of one constraint, checked; a 400 naming `param` if refused."""
    try:
        grammar = grammar_for(kind, value)
    except GrammarError as exc:
        raise bad(param, str(exc)) from None
    refusal = LLMatcher.validate_grammar(grammar)
    if refusal:
        raise bad(param, f"the grammar library refuses it: {refusal.strip()}")
    return grammar


def constraints(body: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """Every constraint the request's structured-output fields ask for, as
    (param, kind, value); the text response format and null fields ask for none."""
    found: list[tuple[str, str, Any]] = []
    fmt = body.get("response_format")
    if fmt is not None:
        found += _response_format(fmt)
    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise bad("structured_outputs", f"must be an object, got {describe(so)}")
        found += [(f"structured_outputs.{k}", k, so[k]) for k in STRUCTURED_KINDS
                  if so.get(k) is not None]  # fmt: skip
    found += [(name, kind, body[name]) for name, kind in GUIDED.items()
              if body.get(name) is not None]  # fmt: skip
    return found


def _response_format(fmt: Any) -> list[tuple[str, str, Any]]:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return []
    if kind == "json_object":
        return [("response_format", "json_object", None)]
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            got = describe(spec.get("schema") if isinstance(spec, dict) else spec)
            raise bad("response_format.json_schema.schema", f"must be an object, got {got}")
        return [("response_format.json_schema.schema", "json", spec["schema"])]
    shown = describe(kind if isinstance(fmt, dict) else fmt)
    raise bad("response_format.type", f'must be "text", "json_object" or "json_schema", '
              f"got {shown}")  # fmt: skip


def request_grammar(body: dict[str, Any], tool_grammar: tuple[str, str, Any] | None) -> str:
    """The request's grammar ("" when unconstrained); a 400 for two at once."""
    found = constraints(body) + ([tool_grammar] if tool_grammar else [])
    if len(found) > 1:
        raise bad(found[1][0], f"cannot be combined with {found[0][0]}: one constraint at a time")
    return compiled(*found[0]) if found else ""
