"""The routing policy interface, and the pieces every built-in policy shares.

After each forward on model `m`, the policy looks at the whole batch (logits, last
hidden states, sampled candidates) and returns one `Route` per request:

    Route(dst=m, commit=True)    keep the candidate, stay on m
    Route(dst=j, commit=True)    keep the candidate, model j makes the next position
    Route(dst=j, commit=False)   drop the candidate, model j regenerates this position

Decisions are computed as tensor ops over the batch: a policy may return them as a
`RouteBatch` of device tensors, which the engine copies to the host together with the
sampled tokens, in the step's one copy; a policy that decides in Python returns a list.
Deduplication of peer messages is the engine's job (by
`handoff_seq`), never a policy's, so a policy cannot break exactly-once delivery.

A policy that carries per-request state across a handoff (a step-level router's mode,
a router's features) writes it in `send` (bytes riding on the handoff) and reads it in
`receive` (called once per handoff the engine accepted); both default to nothing.

A policy with a threshold reports it (`threshold`) and takes a new one live
(`set_threshold`): the daemon's share control (`target_large_share`) steers it. A request
may bring its own (`routing.threshold`, or `routing.large_share`, held within the request
by trd/policies/budget.py): `ThresholdPolicy.taus` gives each row its threshold.
A request with `routing.model` is routed by none of this: `pinned` keeps it on its model.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from trd.policies.budget import may_stay, remember, share_tau
from trd.policies.params import THRESHOLDS
from trd.protocol import SamplingParams


class RequestView(Protocol):
    """What a policy may read and keep of a request."""

    rid: int
    seq: list[int]  # prompt + committed output
    prompt_len: int
    params: SamplingParams  # its routing: params.routing
    policy_state: Any
    large_tokens: int  # output tokens the last model wrote
    share_tau: float  # the entry model's threshold for a large_share (trd/policies/budget.py)
    scores: list[float]  # the entry model's oriented scores so far, sorted (large_share)

    @property
    def num_output(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Route:
    dst: int
    commit: bool


@dataclass(frozen=True, slots=True)
class RouteBatch:
    """Routes of a batch as tensors on the logits' device, not yet copied to the host."""

    dst: torch.Tensor  # (B,) long
    commit: torch.Tensor  # (B,) bool


Routes = Sequence[Route] | RouteBatch


def host_routes(routes: Routes) -> list[Route]:
    """Routes as a list; a `RouteBatch` costs a device->host copy (the engine avoids this
    path: it copies a batch's routes together with its tokens)."""
    if not isinstance(routes, RouteBatch):
        return list(routes)
    both = torch.stack([routes.dst.long(), routes.commit.long()]).tolist()
    return [Route(d, bool(c)) for d, c in zip(*both, strict=True)]


@dataclass(frozen=True, slots=True)
class PolicyContext:
    model: int  # index of the model this engine runs (0 = entry/small)
    num_models: int
    embed: Callable[[torch.Tensor], torch.Tensor]  # token ids -> input embeddings
    model_dir: Path | None = None  # this model's checkpoint folder (its tokenizer, config)

    @property
    def last(self) -> int:
        return self.num_models - 1

    @property
    def device(self) -> torch.device:
        """The engine's device (its embedding's): every tensor a policy builds goes there."""
        table = getattr(self.embed, "weight", None)
        if isinstance(table, torch.Tensor):
            return table.device
        device = getattr(self.embed, "device", None)  # a quantised table (QuantEmbedding)
        return device if isinstance(device, torch.device) else torch.device("cpu")


@dataclass(frozen=True, slots=True)
class StepView:
    """What a forward produced for the requests whose feed completed."""

    logits: torch.Tensor  # (B, V)
    hidden: torch.Tensor  # (B, H)
    tokens: torch.Tensor  # (B,) sampled candidates, on the logits' device

    def row(self, i: int) -> StepView:
        return StepView(self.logits[i : i + 1], self.hidden[i : i + 1], self.tokens[i : i + 1])


class RoutingPolicy(ABC):
    name: str = ""

    def __init__(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def route(self, reqs: Sequence[RequestView], step: StepView) -> Routes:
        """One route per request, in batch order."""

    def send(self, req: RequestView, dst: int) -> bytes:
        """What rides with `req`'s handoff to model `dst` (at most 64 KiB)."""
        return b""

    def receive(self, req: RequestView, extra: bytes) -> None:  # noqa: B027 - optional hook
        """`req` arrived here with `extra` from the sender's `send`."""

    @property
    def threshold(self) -> float | None:
        """The threshold in force, for policies that have one."""
        return None

    def set_threshold(self, tau: float) -> None:
        """Decide with `tau` from the next step on (the daemon's share control)."""
        raise ValueError(f"policy {self.name!r} has no threshold")


def pinned(reqs: Sequence[RequestView], routes: Routes, model: int) -> Routes:
    """`routes` (decided on `model`) with each request pinned to a model (`routing.model`)
    sent there: kept, its candidate committed, on its own model (where it is submitted and
    stays); handed over, the candidate dropped, from any other."""
    pins = [r.params.routing.model for r in reqs]
    if all(pin is None for pin in pins):
        return routes
    if not isinstance(routes, RouteBatch):
        return [
            route if pin is None else Route(pin, pin == model)
            for pin, route in zip(pins, routes, strict=True)
        ]
    dev = routes.dst.device
    mask = torch.tensor([pin is not None for pin in pins], device=dev)
    dst = torch.tensor([model if pin is None else pin for pin in pins], device=dev)
    return RouteBatch(
        torch.where(mask, dst, routes.dst), torch.where(mask, dst == model, routes.commit)
    )


class ThresholdPolicy(RoutingPolicy):
    """A policy that decides by comparing a score with one threshold, `tau`, or with the
    request's own (`taus`)."""

    tau: float

    @property
    def threshold(self) -> float | None:
        return self.tau

    def set_threshold(self, tau: float) -> None:
        self.tau = tau

    def taus(self, reqs: Sequence[RequestView], score: torch.Tensor) -> torch.Tensor | float:
        """Each row's threshold, in the score's dtype (so a request's own threshold compares
        as the policy's would): the request's, else the policy's; the policy's as a number
        while no row has its own (the common case: nothing to copy to the device)."""
        own = [self._own(r) for r in reqs]
        if all(t is None for t in own):
            return self.tau
        values = [self.tau if t is None else t for t in own]
        return torch.tensor(values, dtype=score.dtype, device=score.device)

    def _own(self, req: RequestView) -> float | None:
        routing = req.params.routing
        if routing.large_share is None:
            return routing.threshold
        if self.ctx.model == 0:  # the entry model sets it; the others read what travelled
            tau = share_tau(req.scores, routing.large_share, req.num_output, req.large_tokens)
            req.share_tau = -tau if THRESHOLDS[self.name].raises_share else tau
        return req.share_tau

    def record(
        self,
        reqs: Sequence[RequestView],
        score: torch.Tensor,
        decided: Sequence[bool] | None = None,
    ) -> None:
        """On the entry model, after its decisions (`decided` rows: all by default): each
        request holding a large_share keeps its score (one copy to the host, of its rows)."""
        if self.ctx.model != 0:
            return
        rows = [
            i
            for i, r in enumerate(reqs)
            if r.params.routing.large_share is not None and (decided is None or decided[i])
        ]
        if not rows:
            return
        sign = -1.0 if THRESHOLDS[self.name].raises_share else 1.0  # higher: less certain
        for i, value in zip(rows, score[rows].tolist(), strict=True):
            remember(reqs[i].scores, sign * value)

    def may_stay(self, reqs: Sequence[RequestView], like: torch.Tensor) -> torch.Tensor | None:
        """Rows whose request may have the last model write its next token too (False only
        for a large_share the next large token would exceed); None when all may."""
        ok = [
            r.params.routing.large_share is None
            or may_stay(r.params.routing.large_share, r.num_output, r.large_tokens)
            for r in reqs
        ]
        return None if all(ok) else torch.tensor(ok, device=like.device)


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """H = -sum p log p / log V per row, in [0, 1].

    V is the tokenizer's vocabulary: the runner cuts the embedding matrix's padding rows
    off the logits, so two models of one family padded differently agree on V."""
    return logp_entropy(torch.log_softmax(logits, dim=-1))


def logp_entropy(logp: torch.Tensor) -> torch.Tensor:
    """normalized_entropy of rows already turned into log-probabilities. A token a grammar
    forbids (log-probability -inf) adds 0, not 0 * -inf = NaN."""
    plogp = torch.where(logp > -torch.inf, logp.exp() * logp, 0.0)
    return -plogp.sum(-1) / math.log(logp.shape[-1])
