"""Benchmark workloads per model pair, modelled on the paper's.

    tiny (the fixtures; prompts cut from held-out fixture text, exact lengths)
        short  prompt 100 tokens, max output 256
        long   prompt 100 tokens, output lengths swept up to 2048
        agent  prompt 1500 tokens, max output 256
    demo (the real pair; the chat prompts of `chat_prompts.py` through the model's own
          chat template, as the daemon renders /v1/chat/completions)
        short  max output 256
        long   output lengths swept up to 2048

Prompts come in an order fixed by the workload's seed, and a run of `count` requests
serves the first `count`: every system and every run sees the same requests, and a
smaller run's prompts are a prefix of a larger one's. Decoding is greedy with EOS
ignored: every request produces exactly `max_tokens` tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer

from trd.bench.chat_prompts import CHAT_PROMPTS
from trd.frontend.tokens import PromptEncoder
from trd.testing.tinymodels.corpus import corpus


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
    """The workload's first `count` prompts, as token ids."""
    if workload.source == "chat":
        return chat_prompts(tokenizer_dir, workload.seed, count)
    return corpus_prompts(tokenizer_dir, workload, count)


def chat_prompts(tokenizer_dir: Path, seed: int, count: int) -> list[list[int]]:
    """`count` user messages through the chat template, in the order `seed` gives."""
    if count > len(CHAT_PROMPTS):
        raise ValueError(f"the chat workload has {len(CHAT_PROMPTS)} prompts, {count} asked")
    order = list(CHAT_PROMPTS)
    random.Random(seed).shuffle(order)
    encoder = PromptEncoder(tokenizer_dir)
    return [encoder.chat([{"role": "user", "content": text}]) for text in order[:count]]


def corpus_prompts(tokenizer_dir: Path, workload: Workload, count: int) -> list[list[int]]:
    """`count` prompts of exactly `workload.prompt_tokens` tokens from held-out text."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    docs = list(corpus("heldout"))
    random.Random(workload.seed).shuffle(docs)
    out: list[list[int]] = []
    for doc in docs:
        ids = tok.encode(doc).ids
        # A long document gives several prompts; stepping by a prime varies the offsets.
        for start in range(0, len(ids) - workload.prompt_tokens + 1, workload.prompt_tokens + 7):
            out.append(ids[start : start + workload.prompt_tokens])
            if len(out) == count:
                return out
    raise ValueError(f"held-out text holds only {len(out)} prompts of {workload.prompt_tokens}")
