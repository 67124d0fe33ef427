"""The reference loop's own decision rule of every built-in policy, one position at a time.

Written from each policy's definition (its paper and trd/policies' docstrings), not from
trd/policies' code, so that an oracle test compares two independent implementations.
After model m made a candidate for the output position p, a rule answers (dst, keep):
keep the candidate or drop it, and which model makes the next (or, dropped, the same)
position. Every rule reads only the step's logits (after the grammar mask and the
early-stop ban), the hidden state, the candidate and the committed output: no state
rides on a handoff.

    rstitch   H = -sum p ln p / ln V (V: the logits' width, 0 ln 0 = 0). m below the last
              model and H > tau: drop, m + 1 regenerates; m above the first and
              H <= tau: keep, back to model 0; else keep and stay
    citer     on model 0, a head's confidence c: c < tau: drop, the last model makes p
    r2r       on model 0, a head's divergence d: d >= tau: drop, the last model makes p
    collm     on model 0, a head's deferral d: d > tau: drop, the last model makes p
              (on any other model: keep, back to model 0)
    glimp     the output is cut into steps (a step ends after the token that makes the
              decoded text end in a blank line, or at its step_tokens-th token). On model
              0 at a step's first position: top-20 entropy (nats) >= tau: drop, the last
              model writes the step; after `think_end` was committed the last model
              writes everything; model 0 keeps a `think_end` candidate and hands the rest
              to the last. Elsewhere: keep; the last model hands back at a step's end
    ensemble  the owner of p is the first model whose cumulative weight exceeds
              uniform(seed XOR crc32(prompt as int32 bytes), p) (else the last)
    scripted  the owner of p is schedule[p % len(schedule)]
              (both: m is not p's owner: drop, the owner makes p; else keep, the owner
              of p + 1 makes the next)

A request may bring its own routing (SamplingParams.routing). `model`: every token on
that model (the loop pins it; no rule runs). `threshold`: it replaces the policy's tau for
this request. `large_share` s: the entry model sets the request's tau before each of its
decisions from the request's own history: with S the entry model's earlier scores in this
request (oriented: higher is less certain; CITER's confidence negated), N the output so far
and L the last model's part of it, p = s + (s (N + 1) - L) / 4, and tau the
ceil((1 - p) |S|)-th smallest of S (+inf when S is empty or p <= 0, -inf when p >= 1), so
the least certain fraction p of the request's positions escalates; the other models decide
with the tau the entry model set last. R-Stitch's last model then stays only while
L + 2 <= s (N + 2). GlimpRouter keeps the scores of its probes only.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from trd.policies.heads import RouterHead, load_head
from trd.policies.params import (
    EnsembleParams,
    GatedParams,
    GlimpParams,
    PolicySpec,
    RStitchParams,
    ScriptedParams,
    parse_policy,
)
from trd.policies.r2r_file import is_torch_file, load_r2r_router
from trd.protocol import SamplingParams
from trd.testing.reference_sampling import uniform


@dataclass
class OwnRouting:
    """A request's large_share state: the entry model's oriented scores so far, and the
    threshold it set last (which the other models decide with)."""

    scores: list[float] = field(default_factory=list)
    tau: float = math.nan


@dataclass(frozen=True)
class Position:
    """What a rule may read after model `model` made `token` for output position
    len(output)."""

    model: int
    logits: torch.Tensor  # (V,) as sampling saw them
    hidden: torch.Tensor  # (H,) the last layer's output (after the final norm)
    token: int
    prompt: Sequence[int]
    output: Sequence[int]  # committed so far
    params: SamplingParams
    large: int = 0  # output tokens the last model wrote
    own: OwnRouting = field(default_factory=OwnRouting)


GAIN_TOKENS = 4.0


def threshold(at: Position, tau: float, raises_share: bool) -> float:
    """The threshold `at` is decided with: the request's own, else the policy's `tau`."""
    routing = at.params.routing
    if routing.large_share is None:
        return tau if routing.threshold is None else routing.threshold
    if at.model == 0:
        s, made = routing.large_share, len(at.output)
        p = s + (s * (made + 1) - at.large) / GAIN_TOKENS
        ranked = sorted(at.own.scores)
        if not ranked or p <= 0:
            oriented = math.inf
        elif p >= 1:
            oriented = -math.inf
        else:
            oriented = ranked[math.ceil((1 - p) * len(ranked)) - 1]
        at.own.tau = -oriented if raises_share else oriented
    return at.own.tau


def keep_score(at: Position, score: float, raises_share: bool) -> None:
    """After the entry model's decision: a large_share request keeps its oriented score."""
    if at.model == 0 and at.params.routing.large_share is not None:
        at.own.scores.append(-score if raises_share else score)


Decision = tuple[int, bool]  # (the model that goes next, keep the candidate)
Rule = Callable[[Position], Decision]


def entropy_nats(logits: torch.Tensor) -> float:
    """-sum p ln p of softmax(logits), with 0 ln 0 = 0 (a forbidden token adds nothing)."""
    p = torch.softmax(logits.double(), dim=0)
    return -sum(q * math.log(q) for q in p.tolist() if q > 0)


def rstitch(tau: float, last: int) -> Rule:
    def rule(at: Position) -> Decision:
        h = entropy_nats(at.logits) / math.log(at.logits.shape[0])
        unsure = h > threshold(at, tau, raises_share=False)
        keep_score(at, h, raises_share=False)
        share = at.params.routing.large_share
        if unsure and at.model < last:
            return at.model + 1, False
        if at.model == last and share is not None:  # one more large token must fit
            unsure = unsure and at.large + 2 <= share * (len(at.output) + 2)
        if not unsure and at.model > 0:
            return 0, True
        return at.model, True

    return rule


def owner_rule(owner: Callable[[Position, int], int]) -> Rule:
    def rule(at: Position) -> Decision:
        p = len(at.output)
        if owner(at, p) != at.model:
            return owner(at, p), False
        return owner(at, p + 1), True

    return rule


def scripted(schedule: Sequence[int]) -> Rule:
    return owner_rule(lambda at, p: schedule[p % len(schedule)])


def ensemble(weights: Sequence[float], seed: int) -> Rule:
    total = sum(weights)

    def owner(at: Position, p: int) -> int:
        key = seed ^ zlib.crc32(np.array(at.prompt, dtype="<i4").tobytes())
        u, edge = uniform(key, p), 0.0
        for model, w in enumerate(weights):
            edge += w / total
            if u < edge:
                return model
        return len(weights) - 1

    return owner_rule(owner)


# -- the learned gates -------------------------------------------------------------------
def mlp(head: RouterHead, x: torch.Tensor) -> float:
    """Linear, ReLU, ..., Linear, then a sigmoid on the one output."""
    for i, (w, b) in enumerate(head.layers):
        x = w.to(x.dtype) @ x + b.to(x.dtype)
        x = x.clamp(min=0) if i + 1 < len(head.layers) else x
    return 1 / (1 + math.exp(-float(x[0])))


def logit_features(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest log-probabilities (a forbidden token's read as -1e4), descending, then
    the normalised entropy and the top-20 entropy (nats)."""
    logp = torch.log_softmax(logits.double(), dim=0)
    top = sorted(logp.tolist(), reverse=True)[:k]
    h = entropy_nats(logits)
    feats = [max(v, -1e4) for v in top] + [h / math.log(logits.shape[0]), top20_entropy(logits)]
    return torch.tensor(feats, dtype=torch.float64)


def head_score(
    name: str, path: Path, embed: Any
) -> tuple[Callable[[Position], float], float | None]:
    """The head file's score of a position, and the threshold stored with it. Only the
    weights are read by trd/policies (its file formats); the inputs are built here."""
    table = embed.weight
    if name == "r2r" and is_torch_file(path):
        router = load_r2r_router(path, table.shape[1], table.shape[0]).to(
            torch.float64, table.device
        )

        def published(at: Position) -> float:
            token = torch.tensor([at.token], device=table.device)
            emb = router.embed[at.token] if router.embed is not None else embed(token)[0]
            top = torch.topk(at.logits.double(), router.top_k).values
            return float(router(at.hidden.double()[None], emb.double()[None], top[None])[0])

        return published, router.threshold
    head = load_head(path, name)

    def ours(at: Position) -> float:
        x = [at.hidden.double()]
        if name == "r2r":  # h, the candidate's embedding, the top raw logits
            x.append(embed(torch.tensor([at.token], device=table.device))[0].double())
            x.append(torch.topk(at.logits.double(), head.top_k).values)
        elif head.top_k:  # citer, collm: h and, if trained so, the logits' features
            x.append(logit_features(at.logits, head.top_k).to(at.hidden.device))
        return mlp(head, torch.cat(x))

    return ours, head.threshold


RAISES_SHARE = {"citer": True, "r2r": False, "collm": False}  # a higher tau: more large
ESCALATE: dict[str, Callable[[float, float], bool]] = {
    "citer": lambda confidence, tau: confidence < tau,
    "r2r": lambda divergence, tau: divergence >= tau,
    "collm": lambda deferral, tau: deferral > tau,
}


def gate(name: str, params: GatedParams, embed: Any, last: int) -> Rule:
    score, stored = head_score(name, Path(params.head), embed)
    tau = params.threshold if params.threshold is not None else stored
    assert tau is not None, "a head without a stored threshold needs policy.threshold"
    escalate = ESCALATE[name]

    raises = RAISES_SHARE[name]

    def rule(at: Position) -> Decision:
        if at.model != 0:
            return 0, True  # the large model made the one position: back to the small
        value = score(at)
        up = escalate(value, threshold(at, tau, raises))
        keep_score(at, value, raises)
        return (last, False) if up else (0, True)

    return rule


# -- GlimpRouter --------------------------------------------------------------------------
def top20_entropy(logits: torch.Tensor) -> float:
    return entropy_nats(torch.topk(logits.double(), min(20, logits.shape[0])).values)


def glimp(params: GlimpParams, tokenizer: Tokenizer, last: int) -> Rule:
    think_end = params.think_end or "</think>"

    def text(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=False))

    def is_think(token: int) -> bool:
        return text([token]) == think_end

    @lru_cache(maxsize=1 << 14)
    def step_of(output: tuple[int, ...]) -> tuple[int, bool]:
        """(where the step of the next position began, whether think_end was committed);
        the loop asks at every position, so output[:-1] is known already."""
        if not output:
            return 0, False
        start, answer = step_of(output[:-1])
        if answer or is_think(output[-1]):
            return start, True
        n = len(output)
        return (
            (n, False)
            if text(output).endswith("\n\n") or n - start >= params.step_tokens
            else (start, False)
        )

    def rule(at: Position) -> Decision:
        start, answer = step_of(tuple(at.output))
        if at.model == 0:
            probe = start == len(at.output)
            h = top20_entropy(at.logits)
            tau = threshold(at, params.threshold, raises_share=False)
            if probe and not answer:
                keep_score(at, h, raises_share=False)
            if answer or (probe and h >= tau):
                return last, False
            return (last if is_think(at.token) else 0), True
        made = [*at.output, at.token]
        ends = text(made).endswith("\n\n") or len(made) - start >= params.step_tokens
        stay = answer or is_think(at.token) or not ends
        return (last if stay else 0), True

    return rule


def make_rule(spec: PolicySpec, paths: Sequence[Path], embed: Any) -> Rule:
    """The rule of `spec` for models `paths` (0 the entry); `embed`: model 0's input
    embedding (the r2r head reads the candidate's)."""
    last = len(paths) - 1
    params = parse_policy(spec.name, spec.params, len(paths))  # checked, with its defaults
    if isinstance(params, RStitchParams):
        return rstitch(params.threshold, last)
    if isinstance(params, ScriptedParams):
        return scripted(params.schedule)
    if isinstance(params, EnsembleParams):
        return ensemble(params.weights, params.seed)
    if isinstance(params, GlimpParams):
        return glimp(params, Tokenizer.from_file(str(Path(paths[0]) / "tokenizer.json")), last)
    return gate(spec.name, params, embed, last)
