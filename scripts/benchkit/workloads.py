"""Benchmark workloads modelled on the paper's, scaled to the fixture models.

    short  reasoning: prompt ~100 tokens, max output 256
    long   reasoning: prompt ~100 tokens, max output 2048
    agent  -like:     prompt ~1500 tokens, max output 256

Prompts are cut from the held-out split of the fixture corpus (text the models never
trained on), in an order fixed by the workload's seed, so every system and every run
sees the same requests. Decoding is greedy with EOS ignored: every request produces
exactly `max_tokens` tokens and all systems must agree on them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path

from tokenizers import Tokenizer

from trd.tinymodels.corpus import corpus


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    prompt_tokens: int
    max_tokens: int
    seed: int

    def with_max_tokens(self, max_tokens: int) -> Workload:
        return replace(self, name=f"{self.name}@{max_tokens}", max_tokens=max_tokens)


WORKLOADS = {
    "short": Workload("short", prompt_tokens=100, max_tokens=256, seed=1),
    "long": Workload("long", prompt_tokens=100, max_tokens=2048, seed=2),
    "agent": Workload("agent", prompt_tokens=1500, max_tokens=256, seed=3),
}


def prompts(tokenizer_dir: Path, workload: Workload, count: int) -> list[list[int]]:
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
