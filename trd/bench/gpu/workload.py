"""The GPU plan's requests and the tokens every system must write for them.

Prompts: `prompt_tokens` ids of held-out text through the shaped pair's tokenizer
(`bench` datasets' `random` set, seeded), the same list for every system; a run of k
requests serves the first k. Routing: at large share s the owner of each output position
is drawn by the ensemble policy (weights 1 - s, s; the plan's seed): a counter-based draw
from (seed, prompt, position), the same in every engine, the transformers loop and here.
The shaped weights make known tokens (trd/testing/shaped.py: the small model repeats the
current token, the large adds one), so the output of every request is known before any
system runs: `Designed` holds it as the reference of `trd.bench.identity`, and every
record of every system is compared with it, by token ids and the model of each token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from trd.bench import datasets
from trd.bench.identity import Reference, identity
from trd.policies.base import PolicyContext
from trd.policies.factory import make_policy
from trd.policies.params import PolicySpec
from trd.policies.schedule import EnsemblePolicy
from trd.testing.shaped import expected_tokens

NAMES = ("small", "large")  # the models' names in every system
PROMPT_SEED = 1


def prompts(tokenizer: Path, count: int, length: int) -> list[list[int]]:
    convs = datasets.load("random", count, PROMPT_SEED, input_len=length, tokenizer=tokenizer)
    return [ids for c in convs if isinstance(ids := c.turns[0], list)]


def routing(share: float, seed: int) -> PolicySpec:
    """The ensemble policy giving the large model `share` of the positions."""
    return PolicySpec("ensemble", {"weights": [1 - share, share], "seed": seed})


def owners(prompt: Sequence[int], n: int, share: float | None, seed: int) -> list[int]:
    """The model of each of the n output positions (share None: the large model alone)."""
    if share is None:
        return [1] * n
    ctx = PolicyContext(0, 2, lambda ids: ids)
    policy = make_policy(routing(share, seed), ctx)
    assert isinstance(policy, EnsemblePolicy)
    req = SimpleNamespace(seq=list(prompt), prompt_len=len(prompt), policy_state=None)
    return [policy.owner(req, p) for p in range(n)]  # type: ignore[arg-type]


class Designed:
    """The reference: each prompt's designed output at the longest length asked."""

    def __init__(self, served: Iterable[Sequence[int]], n: int, share: float | None, seed: int):
        self.ref = Reference()
        for prompt in served:
            who = owners(prompt, n, share, seed)
            self.ref.add(prompt, expected_tokens(prompt, n, who), [NAMES[m] for m in who])

    def check(self, run: dict[str, Any], records: Sequence[Any]) -> None:
        """Mark each record's first divergence (-1: identical) and put the run's identity
        entry (`trd.bench.identity.identity`) into `run`."""
        for rec, row in zip(records, run["records"], strict=True):
            row["diverges_at"] = self.ref.divergence(
                rec.prompt_ids or [], rec.token_ids or [], rec.models or []
            )
        run["identity"] = identity([run], self.ref.table())[0]

    @staticmethod
    def identical(run: dict[str, Any]) -> bool:
        i = run.get("identity") or {}
        return bool(i) and i["identical"] == i["compared"] and not i["no_reference"]
