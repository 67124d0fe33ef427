"""Benchmark workloads per model pair, modelled on the paper's.

    tiny (the fixtures; prompts cut from held-out fixture text, exact lengths)
        short  prompt 100 tokens, max output 256
        long   prompt 100 tokens, output lengths swept up to 2048
        agent  prompt 1500 tokens, max output 256
    demo (the real pair; the chat prompts of `trd/bench/chat_prompts.py` through the
          model's own chat template, as the daemon renders /v1/chat/completions)
        short  max output 256
        long   output lengths swept up to 2048

Prompts come in an order fixed by the workload's seed, and a run of `count` requests
serves the first `count`: every system and every run sees the same requests, and a
smaller run's prompts are a prefix of a larger one's. Decoding is greedy with EOS
ignored: every request produces exactly `max_tokens` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from trd.bench import datasets
from trd.frontend.tokens import PromptEncoder


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    prompt_tokens: int  # corpus: the length of every prompt; chat: 0 (as rendered)
    max_tokens: int
    seed: int
    source: Literal["corpus", "chat"] = "corpus"

    def with_max_tokens(self, max_tokens: int) -> Workload:
        return replace(self, name=f"{self.name}@{max_tokens}", max_tokens=max_tokens)


WORKLOADS: dict[str, dict[str, Workload]] = {
    "tiny": {
        "short": Workload("short", prompt_tokens=100, max_tokens=256, seed=1),
        "long": Workload("long", prompt_tokens=100, max_tokens=2048, seed=2),
        "agent": Workload("agent", prompt_tokens=1500, max_tokens=256, seed=3),
    },
    "demo": {
        "short": Workload("short", prompt_tokens=0, max_tokens=256, seed=1, source="chat"),
        "long": Workload("long", prompt_tokens=0, max_tokens=2048, seed=2, source="chat"),
    },
}


def prompts(tokenizer_dir: Path, workload: Workload, count: int) -> list[list[int]]:
    """The workload's first `count` prompts, as token ids (`trd.bench.datasets`' chat and
    random sets, the chat ones rendered through the model's template)."""
    if workload.source == "chat":
        encoder = PromptEncoder(tokenizer_dir)
        chats = datasets.load("chat", count, workload.seed)
        return [encoder.chat([{"role": "user", "content": str(c.turns[0])}]) for c in chats]
    convs = datasets.load("random", count, workload.seed, input_len=workload.prompt_tokens,
                          tokenizer=tokenizer_dir)  # fmt: skip
    return [ids for c in convs if isinstance(ids := c.turns[0], list)]
