"""One request's record, and the request a conversation's turn makes.

A turn's prompt is the conversation so far (`datasets.Conversation`): for chat, the
system message, the user turns and the server's own answers as assistant messages; for
completions, the parts joined (token ids when the parts are ids, else text).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trd.bench.datasets import Conversation, Part
from trd.bench.identity import digest_ids, digest_output, digest_text


@dataclass
class Record:
    """One request: what was sent, when, and what came back."""

    conversation: int
    turn: int
    prompt: str  # digest of the prompt as sent (token ids or text)
    sent: float  # seconds after the run's start
    ttft: float | None = None
    latency: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None  # the server's usage
    output_tokens: int = 0
    counted_by: str = "usage"  # or "token_ids", "chunks": where output_tokens came from
    text: str = ""
    token_ids: list[int] | None = None
    models: list[str] | None = None  # producer of each output token (ours)
    tokens_per_model: dict[str, int] | None = None  # the server's usage, in its models' order
    error: str | None = None
    cut: bool = False  # the client closed the stream before its end (Client.send's cut_after)
    prompt_ids: list[int] | None = field(default=None, repr=False)  # a token-id prompt

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.latency is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    @property
    def handoffs(self) -> int | None:
        """Changes of producing model between consecutive output tokens."""
        return (
            None if self.models is None else sum(a != b for a, b in itertools.pairwise(self.models))
        )

    @property
    def output(self) -> str | None:
        """Identity digest: the output token ids AND the model that produced each."""
        if self.token_ids is None or self.models is None:
            return None
        return digest_output(self.token_ids, self.models)

    def to_dict(self) -> dict[str, Any]:
        """What the JSON keeps: timings, counts, digests (ids and text stay in memory),
        and the producers as one digit a token, the model's index in tokens_per_model."""
        names = list(self.tokens_per_model or {})
        producers = None
        if self.models is not None and set(self.models) <= set(names):
            producers = "".join(str(names.index(m)) for m in self.models)
        return {
            "conversation": self.conversation, "turn": self.turn, "prompt": self.prompt,
            "sent_s": self.sent, "ttft_s": self.ttft, "latency_s": self.latency,
            "tpot_s": self.tpot, "itl_s": [round(x, 6) for x in self.itl],
            "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
            "counted_by": self.counted_by, "text": digest_text(self.text),
            "output": self.output, "producers": producers,
            "tokens_per_model": self.tokens_per_model, "handoffs": self.handoffs,
            "error": self.error, "cut": self.cut,
        }  # fmt: skip


def chat_messages(conv: Conversation, turn: int, answers: Sequence[Record]) -> list[dict[str, str]]:
    parts = [conv.system, *conv.turns[: turn + 1]]
    if any(isinstance(p, list) for p in parts):
        raise ValueError("token-id prompts go to --endpoint completions, not chat")
    msgs = [{"role": "system", "content": str(conv.system)}] if conv.system is not None else []
    for t in range(turn + 1):
        msgs.append({"role": "user", "content": str(conv.turns[t])})
        if t < turn:
            msgs.append({"role": "assistant", "content": answers[t].text})
    return msgs


def completion_prompt(conv: Conversation, turn: int, answers: Sequence[Record]) -> Part:
    """System, turns and answers joined: token ids when the parts are ids (each answer's
    ids, which the server must have returned), else text, parts on lines of their own."""
    parts: list[Part] = [] if conv.system is None else [conv.system]
    for t in range(turn + 1):
        parts.append(conv.turns[t])
        if t < turn:
            ids = answers[t].token_ids
            if isinstance(conv.turns[t], list) and ids is None:
                raise ValueError("a token-id conversation needs the server to return the "
                                 "answers' token ids (return_token_ids)")  # fmt: skip
            parts.append(ids if isinstance(conv.turns[t], list) and ids is not None
                         else answers[t].text)  # fmt: skip
    id_parts = [p for p in parts if isinstance(p, list)]
    if len(id_parts) == len(parts):
        return [i for p in id_parts for i in p]
    if id_parts:
        raise ValueError("a conversation mixes text and token ids")
    return "\n".join(str(p) for p in parts) if len(parts) > 1 else str(parts[0])


def digest_prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
        return digest_ids(prompt)
    return digest_text(
        json.dumps(prompt, sort_keys=True) if not isinstance(prompt, str) else prompt
    )
