"""The routing policy interface, and the pieces every built-in policy shares.

After each forward on model `m`, the policy looks at the whole batch (logits, last
hidden states, sampled candidates) and returns one `Route` per request:

    Route(dst=m, commit=True)    keep the candidate, stay on m
    Route(dst=j, commit=True)    keep the candidate, model j makes the next position
    Route(dst=j, commit=False)   drop the candidate, model j regenerates this position

Decisions are computed as tensor ops over the batch; only the destination indices and
commit flags reach Python. Deduplication of peer messages is the engine's job (by
`handoff_seq`), never a policy's, so a policy cannot break exactly-once delivery.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from trd.engines.request import Request


@dataclass(frozen=True, slots=True)
class Route:
    dst: int
    commit: bool


@dataclass(frozen=True, slots=True)
class PolicyContext:
    model: int  # index of the model this engine runs (0 = entry/small)
    num_models: int
    embed: Callable[[torch.Tensor], torch.Tensor]  # token ids -> input embeddings

    @property
    def last(self) -> int:
        return self.num_models - 1


@dataclass(frozen=True, slots=True)
class StepView:
    """What a forward produced for the requests whose feed completed."""

    logits: torch.Tensor  # (B, V)
    hidden: torch.Tensor  # (B, H)
    tokens: list[int]  # sampled candidates


class RoutingPolicy(ABC):
    name: str = ""

    def __init__(self, ctx: PolicyContext, **params: Any) -> None:
        if params:
            raise ValueError(f"policy {self.name!r}: unknown parameters {sorted(params)}")
        self.ctx = ctx

    @abstractmethod
    def route(self, reqs: Sequence[Request], step: StepView) -> list[Route]:
        """One route per request, in batch order."""

    def describe(self) -> dict[str, Any]:
        """The policy and its parameters, for `trctl status`."""
        return {"name": self.name}


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = -sum p log p / log V per row, in [0, 1]."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1) / math.log(logits.shape[-1])


def check_threshold(policy: str, key: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValueError(
            f"policy {policy!r}: {key} must be a number in [{low}, {high}], got {value!r}"
        )
    return float(value)
