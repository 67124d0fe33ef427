"""The GPU check's routed workload for the shaped pair wired in one process
(`trd.testing.wiring`), compared token by token: graphs on vs off, and against the token
each shaped checkpoint must write (make_shaped_checkpoints.py: the 0.6B repeats the
current token, the 8B adds one).

The schedule [1, 0, 0, 1, 1, 0] hands requests over at every kind of position: the first
output token is the large model's, later ones alternate in runs of one and two, and the
output lengths end on either model.
"""

from __future__ import annotations

from collections.abc import Sequence

from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.testing.tinymodels.tokenizer import VOCAB_SIZE
from trd.testing.wiring import Job

SCHEDULE = [1, 0, 0, 1, 1, 0]
POLICY = PolicySpec("scripted", {"schedule": SCHEDULE})


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
