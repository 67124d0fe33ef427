"""GlimpRouter: the entropy of a step's first token decides who writes the whole step.

The response is cut into steps (trd/policies/steps.py: a step ends where the text ends
with a blank line, or after `step_tokens` tokens). On the small model (model 0):

    step start  its forward is a probe: H = entropy (nats) of the softmax over its top-20
                logits. H >= tau: the probe token is dropped and the large model (the
                last) writes the step; else the small model keeps it and writes the step
    in a step   keep the token; `</think>` hands the rest (the answer) to the large model

On the large model: keep every token; at the end of its step hand the request back
(the small model probes the next step), unless the answer has begun (`</think>` was
committed), which the large model writes to the end.

Every decision is a function of the committed tokens: where the current step began,
how many newlines end the text, whether `</think>` was committed. Each engine reads
them from `req.seq` as it routes (only the tokens new since its last look), so the
models agree without anything riding on the handoff (`send`/`receive` stay empty) and
the routes are tensor ops over the batch, with no copy to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trd.policies.base import (
    PolicyContext,
    RequestView,
    RouteBatch,
    StepView,
    ThresholdPolicy,
)
from trd.policies.params import GlimpParams, PolicyError
from trd.policies.steps import DeviceTable, StepTable, token_texts

PROBE_TOP_K = 20
THINK_END = "</think>"


def top_entropy(logits: torch.Tensor, k: int = PROBE_TOP_K) -> torch.Tensor:
    """(B, V) -> (B,) entropy in nats of the softmax over each row's top-k logits."""
    top = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values
    return torch.special.entr(torch.softmax(top, dim=-1)).sum(-1)


@dataclass(slots=True)
class StepState:
    """What the committed tokens say, up to output position `seen`."""

    seen: int = 0
    tail: int = 0  # trailing "\n" of the text, up to 2
    step_start: int = 0  # output position of the current step's first token
    answer: bool = False  # `</think>` was committed: the large model writes the rest


class GlimpPolicy(ThresholdPolicy):
    name = "glimp"

    def __init__(self, ctx: PolicyContext, params: GlimpParams) -> None:
        super().__init__(ctx)
        self.tau, self.step_tokens = params.threshold, params.step_tokens
        if ctx.model_dir is None:
            raise PolicyError("policy.name: 'glimp': needs the model's tokenizer (model_dir)")
        rows = getattr(ctx.embed, "num_embeddings", None)  # nn.Embedding or QuantEmbedding
        if not isinstance(rows, int):
            raise PolicyError("policy.name: 'glimp': needs the model's embedding table")
        texts = token_texts(ctx.model_dir, rows)
        self.table = StepTable.of(texts)
        end = params.think_end or THINK_END
        self.think_end = frozenset(i for i, text in enumerate(texts) if text == end)
        if not self.think_end and params.think_end is not None:
            raise PolicyError(f"policy.think_end: {end!r}: no token of {ctx.model_dir}'s "
                              "tokenizer has this text")  # fmt: skip
        self.on_device: tuple[DeviceTable, torch.Tensor] | None = None  # tables, think ids

    def _scan(self, req: RequestView) -> StepState:
        state = req.policy_state
        if not isinstance(state, StepState):
            state = req.policy_state = StepState()
        out = req.seq[req.prompt_len + state.seen :]
        for i, token in enumerate(out, start=state.seen):
            if state.answer:
                break
            if token in self.think_end:
                state.answer = True
                continue
            state.tail = self.table.advance(state.tail, token)
            if state.tail == 2 or i + 1 - state.step_start >= self.step_tokens:
                state.step_start = i + 1
        state.seen = req.num_output
        return state

    def route(self, reqs: Sequence[RequestView], step: StepView) -> RouteBatch:
        dev = step.logits.device
        if self.on_device is None or self.on_device[1].device != dev:
            ids = torch.tensor(sorted(self.think_end), dtype=torch.long, device=dev)
            self.on_device = (self.table.on(dev), ids)
        table, think_ids = self.on_device
        states = [self._scan(r) for r in reqs]
        # What the committed tokens say, per row, in one host-to-device copy.
        rows = [[s.answer, s.step_start == s.seen, s.tail, s.seen + 1 - s.step_start]
                for s in states]  # fmt: skip
        facts = torch.tensor(rows, dtype=torch.long, device=dev).reshape(len(states), 4)
        answer, probe, tail, length = facts.unbind(1)
        answer, probe = answer.bool(), probe.bool()
        tokens = step.tokens.to(dev)
        last = self.ctx.last
        think = torch.isin(tokens, think_ids)
        if self.ctx.model == 0:
            h = top_entropy(step.logits)
            up = (probe & (h >= self.taus(reqs, h))) | answer
            self.record(reqs, h, [s.step_start == s.seen and not s.answer for s in states])
            return RouteBatch(torch.where(up | think, last, 0), ~up)
        ends = (table.advance(tail, tokens) == 2) | (length >= self.step_tokens)
        stay = answer | think | ~ends
        return RouteBatch(torch.where(stay, last, 0), torch.ones_like(stay))
