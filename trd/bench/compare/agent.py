"""The agent-trajectory workload: multi-turn conversations that resend everything so far.

    turn 1   system + tool_1
    turn t   system + tool_1 + answer_1 + ... + tool_{t-1} + answer_{t-1} + tool_t

Every conversation shares one system prompt; its tool outputs are its own. Texts are cut
deterministically from held-out fixture text in the pair's tokens (`trd.bench.datasets`'
agent set, with the tokenizer); answers are the system's own greedy outputs (EOS
ignored), which every system must produce identically. N conversations are in flight
(closed loop, `trd.bench.load`: a finished conversation is replaced by the next); a turn
is sent when its previous answer is in.

The paper's trajectories are ~1,000 system tokens and tool outputs of a few hundred;
the fixtures were trained on 128-token windows and serve at most 1,024 tokens, so their
shape is scaled down (`SHAPES`): the last turn's prompt stays under 800 tokens.

`perfect_hits` says how many prompt tokens a perfect cache of full blocks would have
served: in the order the turns were sent, the longest prefix of whole blocks already
seen in an earlier prompt or answer, at most len - 1 tokens (one is fed for logits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trd.bench import datasets
from trd.bench.datasets import Conversation
from trd.bench.record import Record


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


def conversations(tokenizer_dir: Path, shape: AgentShape, count: int) -> list[Conversation]:
    """`count` conversations over one system prompt, tool outputs from held-out text."""
    cut = datasets.AgentShape(shape.turns, shape.system_tokens, shape.tool_tokens)
    return datasets.agent_conversations(count, 0, cut, tokenizer_dir)


def perfect_hits(turns: Sequence[Record], page_size: int) -> tuple[int, int]:
    """(prompt tokens a perfect full-block cache serves, prompt tokens sent), in send order."""
    seen: set[tuple[int, ...]] = set()  # every full-block prefix computed so far
    hits = asked = 0
    for turn in sorted(turns, key=lambda t: t.sent):
        prompt = turn.prompt_ids or []
        usable = (len(prompt) - 1) // page_size
        blocks = 0
        while blocks < usable and tuple(prompt[: (blocks + 1) * page_size]) in seen:
            blocks += 1
        hits += blocks * page_size
        asked += len(prompt)
        full = prompt + (turn.token_ids or [])
        for b in range(1, len(full) // page_size + 1):
            seen.add(tuple(full[: b * page_size]))
    return hits, asked
