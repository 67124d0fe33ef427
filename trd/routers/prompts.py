"""Prompts for training routers (`tokenrouterd train-router --prompts`).

chat    64 written prompts (TRAIN_CHAT_PROMPTS below; nothing downloaded), through the
        small model's chat template.
magpie  questions the large model writes itself (`trd.demo.teacher`, seeds no other build
        uses), as many as asked for: heads trained on 64 written prompts lost to the
        entropy rule, on 512 of these they beat it (docs/quality.md). For ChatML models.
corpus  the fixture pair (trained on plain text): prompts cut from held-out fixture
        documents, the first half of the documents for training (the second half judges,
        scripts/routerkit/judging.py, with the bench's chat prompts, which share no
        message with these).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer

from trd.demo import teacher
from trd.frontend.tokens import PromptEncoder
from trd.testing.tinymodels.corpus import corpus

Split = Literal["train", "eval"]
# teacher.converse_parallel's seeds are seed * 1_000_003 + i: the partner's build uses
# seed 0, demo_quality's held-out chats 7_777_777 + i; these questions use neither.
MAGPIE_SEED = 2
# Asked for beyond `count`: some questions run past 64 tokens or repeat.
MAGPIE_SPARE = 1.25
MAGPIE_WORKERS = 2

TRAIN_CHAT_PROMPTS = (
    "Explain how a refrigerator keeps food cold.",
    "Write a Python function that returns the largest number in a list.",
    "What is 48 divided by 6? Explain briefly.",
    "Give me four ideas for a rainy afternoon at home.",
    "Write a short poem about a lighthouse.",
    "What is the difference between a virus and a bacterium?",
    "Summarise the story of Cinderella in three sentences.",
    "How do I cook rice on the stove?",
    "Explain what an API is to a beginner.",
    "List five animals that live in the ocean.",
    "Write a thank-you note to a teacher.",
    "Why does ice float on water?",
    "What are the benefits of regular exercise?",
    "Translate 'Where is the train station?' into German.",
    "Write a haiku about snow.",
    "How does a rainbow form?",
    "Explain what a for loop does, with a short example in Python.",
    "What should I bring to a picnic?",
    "Describe how bees make honey.",
    "Write a SQL query that counts the rows in a table named users.",
    "What is gravity?",
    "Give me a simple plan to learn to play the guitar.",
    "Tell me a short story about a dragon who is afraid of the dark.",
    "How do plants get water from the soil?",
    "Compare cats and dogs as pets in a few bullet points.",
    "What is a prime number? Give three examples.",
    "Write a limerick about a forgetful wizard.",
    "Explain the difference between speed and velocity.",
    "How can I stay focused while studying?",
    "Write a shell command that lists the five largest files in a folder.",
    "What was the Industrial Revolution, in a few sentences?",
    "Suggest three names for a coffee shop.",
    "Explain how the heart pumps blood.",
    "Write a JavaScript function that reverses a string.",
    "What is the square root of 144, and why?",
    "Give me tips for writing a good resume.",
    "Write a four-line poem about the moon.",
    "What is the difference between RAM and storage?",
    "Summarise the plot of The Three Little Pigs.",
    "How do I make pancakes?",
    "Explain what a binary search is.",
    "Name four planets of the solar system and one fact about each.",
    "Write a short message inviting friends to a birthday party.",
    "Why do leaves change colour in autumn?",
    "What are renewable energy sources?",
    "Translate 'Thank you very much' into Italian and Portuguese.",
    "Write a haiku about a city at night.",
    "How does an airplane stay in the air?",
    "Explain what a variable is in programming.",
    "What should I do if I feel stressed before an exam?",
    "Describe how a volcano erupts.",
    "Write a regular expression that matches an email address, and explain it.",
    "What is electricity?",
    "Give me a three-day meal plan for a vegetarian.",
    "Tell me a short story about a cat who becomes a detective.",
    "How does the internet send a message from one computer to another?",
    "List the pros and cons of working from home.",
    "What is the area of a circle with radius 3?",
    "Write a limerick about a dog who loves the beach.",
    "Explain the difference between a simile and a metaphor.",
    "How can I save money each month?",
    "Write a Python one-liner that sums the squares of the numbers from 1 to 10.",
    "What is democracy, briefly?",
    "Suggest a name and a motto for a school robotics club.",
)


def prompts(
    source: str, small_dir: Path, count: int, large_dir: Path | None = None
) -> list[list[int]]:
    """Up to `count` training prompts as token ids, of this source (magpie's questions are
    written by the model in large_dir)."""
    if source == "corpus":
        return corpus_prompts(small_dir, "train", count)
    if source == "chat":
        return chat_prompts(small_dir, TRAIN_CHAT_PROMPTS, count)
    if source != "magpie":
        raise ValueError(f"{source} prompts judge heads; train on chat, magpie or corpus")
    if large_dir is None:
        raise ValueError("magpie prompts need the large model that writes them")
    asked = math.ceil(count * MAGPIE_SPARE)
    texts = teacher.questions(large_dir, asked, seed=MAGPIE_SEED, workers=MAGPIE_WORKERS)
    return chat_prompts(small_dir, texts, count)


def chat_prompts(small_dir: Path, texts: Sequence[str], count: int) -> list[list[int]]:
    """The first `count` user messages, each alone in a chat, as the small model's prompt."""
    encoder = PromptEncoder(small_dir)
    return [encoder.chat([{"role": "user", "content": t}]) for t in texts[:count]]


def corpus_prompts(small_dir: Path, split: Split, count: int) -> list[list[int]]:
    """Up to `count` 24-token prompts cut from held-out fixture documents: the first half of
    them for training, the second for judging."""
    tok = Tokenizer.from_file(str(small_dir / "tokenizer.json"))
    docs = corpus("heldout")
    half = docs[: len(docs) // 2] if split == "train" else docs[len(docs) // 2 :]
    out: list[list[int]] = []
    for offset in range(0, 400, 48):  # several prompts per document, 24 tokens each
        for doc in half:
            ids = tok.encode(doc).ids[offset : offset + 24]
            if len(ids) == 24:
                out.append(ids)
            if len(out) == count:
                return out
    return out
