"""The prompts that judge router heads (`eval routing --prompts`), kept apart
from the ones that train them (trd/routers/prompts.py).

chat, magpie  the bench kit's CHAT_PROMPTS (trd/bench/chat_prompts.py), which share
              no message with the training prompts
written       CHAT_PROMPTS and TRAIN_CHAT_PROMPTS, 96 prompts, for heads that were not
              trained on the latter (magpie or corpus heads; `eval routing` checks)
corpus        the second half of the held-out fixture documents
"""

from __future__ import annotations

from pathlib import Path

from trd.bench.chat_prompts import CHAT_PROMPTS
from trd.routers.prompts import TRAIN_CHAT_PROMPTS, chat_prompts, corpus_prompts


def judging_prompts(source: str, small_dir: Path, count: int) -> list[list[int]]:
    """Up to `count` prompts as token ids that judge heads trained on `source`'s."""
    if source == "corpus":
        return corpus_prompts(small_dir, "eval", count)
    texts = CHAT_PROMPTS + TRAIN_CHAT_PROMPTS if source == "written" else CHAT_PROMPTS
    return chat_prompts(small_dir, texts, count)
