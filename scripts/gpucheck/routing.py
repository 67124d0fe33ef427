"""Routing engines of a model pair wired in one process (messages through the real codec),
for comparing outputs token by token: graphs on vs off, and against the token each
shaped checkpoint must write (make_shaped_checkpoints.py: the 0.6B repeats the current
token, the 8B adds one); scripts/demo_quality.py routes the demo pair's answers with it.

The schedule [1, 0, 0, 1, 1, 0] hands requests over at every kind of position: the first
output token is the large model's, later ones alternate in runs of one and two, and the
output lengths end on either model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trd.engines.loop import build
from trd.engines.spec import EngineSpec
from trd.ipc.names import FRONTEND
from trd.policies.params import PolicySpec
from trd.protocol import Done, Emit, Message, SamplingParams, Submit, decode, encode
from trd.supervisor.generation import Generation
from trd.testing.tinymodels.tokenizer import VOCAB_SIZE

SCHEDULE = [1, 0, 0, 1, 1, 0]
POLICY = PolicySpec("scripted", {"schedule": SCHEDULE})
Job = tuple[list[int], SamplingParams]


def jobs(count: int = 12, max_tokens: Sequence[int] = (1, 2, 3, 5, 6, 7, 12, 33)) -> list[Job]:
    """Prompts of 3..60 ids of the shared tokenizer; output lengths ending on both models."""
    return [
        ([(7 * i + 13 * j) % (VOCAB_SIZE - 1) + 1 for j in range(3 + (i * 11) % 58)],
         SamplingParams(max_tokens=max_tokens[i % len(max_tokens)], ignore_eos=True))
        for i in range(count)
    ]  # fmt: skip


def expected_tokens(prompt: list[int], n: int, schedule: Sequence[int]) -> list[int]:
    """What the shaped pair writes: position p adds 1 when the large model (1) owns it."""
    out, cur = [], prompt[-1]
    for p in range(n):
        cur = (cur + schedule[p % len(schedule)]) % VOCAB_SIZE
        out.append(cur)
    return out


class Pair:
    """Two routing engines (0 = small, 1 = large) on `device`, messages kept in queues."""

    def __init__(self, paths: Sequence[Path], policy: PolicySpec, **spec: Any) -> None:
        self.inbox: dict[int, list[Message]] = {FRONTEND: [], 0: [], 1: []}
        self.nodes = [
            build(EngineSpec.of(path, index=i, num_models=2, policy=policy, **spec), self._send)
            for i, path in enumerate(paths)
        ]

    def _send(self, node: int, msg: Message) -> None:
        self.inbox[node].append(decode(encode(msg)))

    def run(self, work: Sequence[Job]) -> list[Generation]:
        gens = {rid: Generation(rid, len(p)) for rid, (p, _) in enumerate(work)}
        for rid, (prompt, params) in enumerate(work):
            self.inbox[0].append(Submit(rid, np.asarray(prompt, np.int32), params))
        for _ in range(100_000):
            for i, node in enumerate(self.nodes):
                msgs, self.inbox[i] = self.inbox[i], []
                for msg in msgs:
                    node.inbox.handle(msg)
                node.step()
            for msg in self.inbox[FRONTEND]:
                if isinstance(msg, Emit):
                    gens[msg.rid].on_emit(msg)
                elif isinstance(msg, Done):
                    gens[msg.rid].on_done(msg)
            self.inbox[FRONTEND].clear()
            if all(g.complete for g in gens.values()):
                return list(gens.values())
        raise RuntimeError("the routed workload did not finish")
