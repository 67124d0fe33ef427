"""The agent-trajectory workload: multi-turn conversations that resend everything so far.

    turn 1   system + tool_1
    turn t   system + tool_1 + answer_1 + ... + tool_{t-1} + answer_{t-1} + tool_t

Every conversation shares one system prompt; its tool outputs are its own. Texts are cut
deterministically from held-out fixture text (`trd.testing.tinymodels.corpus`) and tokenized by
the pair's tokenizer; answers are the system's own greedy outputs (EOS ignored), which
every system must produce identically. N conversations are in flight (closed loop: a
finished conversation is replaced by the next); a turn is sent when its previous answer
is in.

The paper's trajectories are ~1,000 system tokens and tool outputs of a few hundred;
the fixtures were trained on 128-token windows and serve at most 1,024 tokens, so their
shape is scaled down (`SHAPES`): the last turn's prompt stays under 800 tokens.

`perfect_hits` says how many prompt tokens a perfect cache of full blocks would have
served: in the order the turns were sent, the longest prefix of whole blocks already
seen in an earlier prompt or answer, at most len - 1 tokens (one is fed for logits).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from trd.testing.tinymodels.corpus import corpus

from benchkit.client import Record, Send


@dataclass(frozen=True, slots=True)
class AgentShape:
    turns: int
    system_tokens: int
    tool_tokens: int
    answer_tokens: int  # max_tokens of every turn

    @property
    def longest(self) -> int:
        """Tokens of a whole conversation: its last prompt and answer."""
        return self.system_tokens + self.turns * (self.tool_tokens + self.answer_tokens)


SHAPES = {
    "tiny": AgentShape(turns=6, system_tokens=240, tool_tokens=64, answer_tokens=24),
    "demo": AgentShape(turns=6, system_tokens=1000, tool_tokens=300, answer_tokens=128),
}


def scaled_shape(pair: str, turns: int | None, answer_tokens: int | None) -> AgentShape:
    """The pair's shape with fewer turns or shorter answers (a run that fits a CPU)."""
    shape = SHAPES[pair]
    return AgentShape(
        turns=turns or shape.turns,
        system_tokens=shape.system_tokens,
        tool_tokens=shape.tool_tokens,
        answer_tokens=answer_tokens or shape.answer_tokens,
    )


@dataclass(frozen=True, slots=True)
class Conversation:
    system: list[int]
    tools: list[list[int]]  # one tool output per turn


@dataclass(slots=True)
class Turn:
    conv: int
    index: int
    sent: float  # perf_counter when the turn was sent
    record: Record


def conversations(
    tokenizer_dir: Path, shape: AgentShape, count: int, seed: int = 4
) -> list[Conversation]:
    """`count` conversations over one system prompt, tool outputs from held-out text."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    docs = list(corpus("heldout"))
    random.Random(seed).shuffle(docs)
    stream = [t for doc in docs for t in tok.encode(doc).ids]
    need = shape.system_tokens + count * shape.turns * shape.tool_tokens
    if len(stream) < need:
        raise ValueError(f"held-out text holds {len(stream)} tokens, {need} needed")
    system, rest = stream[: shape.system_tokens], stream[shape.system_tokens :]
    n = shape.tool_tokens
    tools = [rest[i * n : (i + 1) * n] for i in range(count * shape.turns)]
    return [
        Conversation(system, tools[c * shape.turns : (c + 1) * shape.turns]) for c in range(count)
    ]


# (conversation, turn) -> seconds after the run's start before which the turn is not sent
Pace = Mapping[tuple[int, int], float]


async def run_conversation(
    send: Send, c: int, conv: Conversation, max_tokens: int, start: float, pace: Pace
) -> list[Turn]:
    seq, turns = list(conv.system), []
    for t, tool in enumerate(conv.tools):
        prompt = seq + tool
        wait = start + pace.get((c, t), 0.0) - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        sent = time.perf_counter()
        record = await send(prompt, max_tokens)
        turns.append(Turn(c, t, sent, record))
        seq = prompt + record.token_ids
    return turns


async def closed_loop_conversations(
    send: Send, convs: Sequence[Conversation], max_tokens: int, n: int, pace: Pace | None = None
) -> tuple[list[list[Turn]], float]:
    """Every conversation with `n` in flight; (turns of each, in order), wall seconds. With
    `pace` (conversations numbered from 0 here) a turn also waits for its time in it: the
    arrivals of another run replayed, so two systems meet the same offered load."""
    out: list[list[Turn]] = [[] for _ in convs]
    todo = iter(range(len(convs)))

    async def worker() -> None:
        for c in todo:
            out[c] = await run_conversation(send, c, convs[c], max_tokens, start, pace or {})

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(n, len(convs)))))
    return out, time.perf_counter() - start


def perfect_hits(turns: Sequence[Turn], page_size: int) -> tuple[int, int]:
    """(prompt tokens a perfect full-block cache serves, prompt tokens sent), in send order."""
    seen: set[tuple[int, ...]] = set()  # every full-block prefix computed so far
    hits = asked = 0
    for turn in sorted(turns, key=lambda t: t.sent):
        prompt = turn.record.prompt
        usable = (len(prompt) - 1) // page_size
        blocks = 0
        while blocks < usable and tuple(prompt[: (blocks + 1) * page_size]) in seen:
            blocks += 1
        hits += blocks * page_size
        asked += len(prompt)
        full = prompt + turn.record.token_ids
        for b in range(1, len(full) // page_size + 1):
            seen.add(tuple(full[: b * page_size]))
    return hits, asked
