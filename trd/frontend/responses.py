"""Response bodies and stream chunks in OpenAI's shapes, plus our per-model token counts.

Every final body and the usage chunk carry, next to OpenAI's `usage`:
    "tokens_per_model": {"small": 40, "large": 9}   output tokens by producing model
    "model_switches": 7                             changes of producer between tokens
    "large_share": 0.1837                           the last (largest) model's share of
                                                    the output tokens (null: no output)
and so does every choice, for its own tokens (in a stream: the chunk that ends it), as
a request's own routing (`routing.large_share`) is held per choice.

Asked with `"return_token_ids": true` (vLLM's field), each choice also carries the
output token ids and, our addition, the model that produced each one:
    "token_ids": [791, 220, 17], "token_models": ["small", "large", "small"]
in a stream, the ids of the tokens that chunk's text was decoded from (the chunks'
lists joined are the whole output). Without the field the bodies are unchanged.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    tokens_per_model: dict[str, int]
    model_switches: int

    @classmethod
    def of(cls, prompt_len: int, choices: list[list[int]], names: list[str]) -> Usage:
        """From each choice's producing models; the prompt counts once, as OpenAI's does."""
        counts = Counter(itertools.chain.from_iterable(choices))
        switches = sum(a != b for models in choices for a, b in itertools.pairwise(models))
        per_model = {name: counts.get(i, 0) for i, name in enumerate(names)}
        return cls(prompt_len, sum(map(len, choices)), per_model, switches)

    @property
    def large_share(self) -> float | None:
        """The last model's share of the output tokens; None without output."""
        if not self.completion_tokens:
            return None
        return list(self.tokens_per_model.values())[-1] / self.completion_tokens

    def routing(self) -> dict[str, Any]:
        """Who wrote the output: what a choice carries, and a body beside its usage."""
        return {
            "tokens_per_model": self.tokens_per_model,
            "model_switches": self.model_switches,
            "large_share": self.large_share,
        }

    def fields(self) -> dict[str, Any]:
        total = self.prompt_tokens + self.completion_tokens
        usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}
        return {"usage": {**usage, "total_tokens": total}, **self.routing()}


@dataclass(frozen=True, slots=True)
class Produced:
    """Output token ids and the name of the model that produced each (return_token_ids)."""

    ids: list[int]
    models: list[str]

    def fields(self) -> dict[str, Any]:
        return {"token_ids": self.ids, "token_models": self.models}


class Shaper:
    """Builds the bodies of one request (completion or chat) under one id and timestamp."""

    def __init__(self, chat: bool, rid: str, model: str) -> None:
        self.chat, self.id, self.model = chat, rid, model
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        if chunk and self.chat:
            kind = "chat.completion.chunk"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def choice(
        self,
        index: int,
        text: str | None,
        finish_reason: str,
        produced: Produced | None = None,
        logprobs: dict[str, Any] | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        counts: Usage | None = None,
    ) -> dict[str, Any]:
        """One choice of a final body (`counts`: its own tokens, for who wrote them); a chat
        message with `tool_calls` has them (and None for content when the text was only
        calls)."""
        choice = {"index": index, "logprobs": logprobs, "finish_reason": finish_reason}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            choice["message"] = {**message, "tool_calls": tool_calls} if tool_calls else message
        else:
            choice["text"] = text
        if produced is not None:
            choice.update(produced.fields())
        if counts is not None:
            choice.update(counts.routing())
        return choice

    def final(self, choices: list[dict[str, Any]], usage: Usage) -> dict[str, Any]:
        return {**self._head(chunk=False), "choices": choices, **usage.fields()}

    def chunk(
        self,
        index: int,
        text: str | None,
        finish_reason: str | None = None,
        usage: Usage | None = None,
        produced: Produced | None = None,
        logprobs: dict[str, Any] | None = None,
        counts: Usage | None = None,
    ) -> dict[str, Any]:
        """A text delta of choice `index`; `None` text opens a chat stream's choice (the
        assistant role, no content).

        With `usage` (vLLM's continuous_usage_stats) the chunk carries the counts so far;
        with `produced` and `logprobs`, the tokens this delta was decoded from; with
        `counts` (the chunk that ends the choice), who wrote the choice's tokens."""
        choice = {"index": index, "logprobs": logprobs, "finish_reason": finish_reason}
        if self.chat:
            choice["delta"] = (
                {"role": "assistant", "content": ""} if text is None else {"content": text}
            )
            if finish_reason is not None:
                choice["delta"] = {}
        else:
            choice["text"] = text or ""
        if produced is not None:
            choice.update(produced.fields())
        if counts is not None:
            choice.update(counts.routing())
        so_far = {} if usage is None else usage.fields()
        return {**self._head(chunk=True), "choices": [choice], **so_far}

    def tool_calls_chunk(self, index: int, deltas: list[dict[str, Any]]) -> dict[str, Any]:
        """Tool-call deltas of a chat choice, each with its call's `index` (OpenAI's
        streamed shape)."""
        choice = {"index": index, "delta": {"tool_calls": deltas}, "logprobs": None,
                  "finish_reason": None}  # fmt: skip
        return {**self._head(chunk=True), "choices": [choice]}

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return {**self._head(chunk=True), "choices": [], **usage.fields()}
