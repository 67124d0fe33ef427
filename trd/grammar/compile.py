"""The one interface to the grammar library: grammars from API fields, matchers per request.

Library: llguidance (vLLM's `guidance` backend), chosen over xgrammar (vLLM's default)
on the merits for this daemon:
  - a self-contained Rust wheel with no torch/triton dependency, so the front end (which
    never imports torch) validates grammars with the same code the engines run;
  - `LLMatcher.rollback` and `deep_copy` built in (a per-request matcher is a cheap
    copy of a compiled one), and an error state instead of exceptions for bad tokens;
  - JSON schema, regex, Lark/GBNF and choices compile lazily: no per-grammar
    precomputation over the vocabulary, so a new schema costs ~1 ms, not a compile step
    per request (xgrammar precomputes token masks per grammar).

    grammar_for(kind, value)   API field -> llguidance grammar text (SamplingParams.grammar)
    Grammars(tokenizer_dir)    tokenizer + compiled-grammar cache (bounded), one per engine
      .check(grammar)          None, or the library's words for what it refused
      .matcher(grammar)        a fresh matcher: a copy of the cached compiled grammar

Torch-free: the front end and the engines both use it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llguidance import LLMatcher, LLTokenizer

from trd.models.tokenizers import TOKENIZER_FILE

if TYPE_CHECKING:  # a stub-only type
    from llguidance._lib import JsonCompileOptions

CACHE_SIZE = 256  # compiled grammars kept by default (least recently used dropped)
KINDS = ("json", "json_object", "regex", "choice", "grammar")
# JSON as json.dumps writes it (", " and ": ", no other whitespace): a model cannot spend
# its max_tokens on newlines between keys, which small models (and routed noise) do.
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}


class GrammarError(ValueError):
    """A grammar the library refuses, in its words."""


def grammar_for(kind: str, value: Any) -> str:
    """The llguidance grammar for one API constraint (`kind` in KINDS); GrammarError when
    the value has the wrong shape. Whether the library compiles it is `Grammars.check`."""
    try:
        if kind == "json":
            schema = json.loads(value) if isinstance(value, str) else value
            if not isinstance(schema, dict):
                raise GrammarError(f"a JSON schema must be an object, got {schema!r:.60}")
            return LLMatcher.grammar_from_json_schema(schema, JSON_OPTIONS)
        if kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, JSON_OPTIONS)
        if kind == "regex":
            return LLMatcher.grammar_from_regex(_text(value, kind))
        if kind == "choice":
            if not (isinstance(value, list) and value and all(isinstance(c, str) for c in value)):
                raise GrammarError("choice must be a non-empty list of strings")
            return LLMatcher.grammar_from_lark("start: " + " | ".join(map(json.dumps, value)))
        if kind == "grammar":
            return LLMatcher.grammar_from_lark(_text(value, kind))
    except (ValueError, TypeError) as exc:
        raise GrammarError(str(exc)) from None
    raise GrammarError(f"unknown grammar kind {kind!r}; expected one of {', '.join(KINDS)}")


def _text(value: Any, kind: str) -> str:
    if not isinstance(value, str) or not value:
        raise GrammarError(f"{kind} must be a non-empty string")
    return value


class Grammars:
    """One tokenizer's grammars: the tokenizer (~1 s to build for a 150k vocabulary, so
    built on first use) and its compiled grammars, kept per grammar text, the `size`
    most recently used. A compiled grammar takes 30-200 KB (measured on the Qwen and the
    fixture tokenizers: a regex, a 3-way choice, a 2-key JSON schema) and grows as its
    requests explore it, up to its automaton's size."""

    def __init__(self, tokenizer_dir: Path, eos_ids: Sequence[int], size: int = CACHE_SIZE) -> None:
        self.tokenizer = _tokenizer(str(Path(tokenizer_dir) / TOKENIZER_FILE), tuple(eos_ids))
        self.size = size
        self._compiled: OrderedDict[str, LLMatcher] = OrderedDict()

    def __len__(self) -> int:
        """Compiled grammars kept."""
        return len(self._compiled)

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.vocab_size)

    def check(self, grammar: str) -> str | None:
        """None when the grammar compiles, else the library's message."""
        return LLMatcher.validate_grammar(grammar, self.tokenizer) or None

    def matcher(self, grammar: str) -> LLMatcher:
        """A matcher at the start of the output; GrammarError when it does not compile."""
        compiled = self._compiled.get(grammar)
        if compiled is None:
            compiled = LLMatcher(self.tokenizer, grammar, log_level=0)
            if compiled.is_error():
                raise GrammarError(compiled.get_error())
            self._compiled[grammar] = compiled
            if len(self._compiled) > self.size:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(grammar)
        return compiled.deep_copy()


@cache
def _tokenizer(path: str, eos_ids: tuple[int, ...]) -> LLTokenizer:
    text = Path(path).read_text(encoding="utf-8")
    return LLTokenizer(text, eos_token=list(eos_ids) or None)
