"""The reference loop: one request, no batching, full recomputation with transformers.

It runs the same policy semantics as the daemon (the policy's decision function on the
same logits and hidden state) but none of the runtime: no paging, no anchors, no
pending KV, no rings. Each position recomputes the whole sequence from scratch on the
current model. Tests use it as the oracle; benchmarks as the research-code baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from trd.engines.constrain import Constraints
from trd.engines.request import Request
from trd.engines.sampler import ban_early_stops, sample
from trd.models.checkpoint import read_checkpoint
from trd.policies.base import PolicyContext, RoutingPolicy, StepView, host_routes
from trd.policies.factory import make_policy
from trd.policies.params import PolicySpec
from trd.protocol import FinishReason, SamplingParams


@dataclass
class Trace:
    tokens: list[int] = field(default_factory=list)
    models: list[int] = field(default_factory=list)  # producer of each token
    finish: FinishReason = FinishReason.NONE
    fed: dict[int, int] = field(default_factory=dict)  # model -> longest sequence it ran on
    forwards: int = 0


class ReferenceRouter:
    def __init__(self, paths: Sequence[Path], policy: PolicySpec, dtype: str = "float64") -> None:
        tdtype = getattr(torch, dtype)
        self.models: list[PreTrainedModel] = [
            AutoModelForCausalLM.from_pretrained(p, dtype=tdtype, attn_implementation="sdpa").eval()
            for p in paths
        ]
        entry = read_checkpoint(Path(paths[0]))
        self.eos = entry.config.eos_token_ids
        self.vocab = entry.vocab_limit  # as the engines: padding rows are never sampled
        self.constraints = Constraints(Path(paths[0]), self.eos)  # masks as the engines'
        self.policies: list[RoutingPolicy] = [
            make_policy(policy, PolicyContext(i, len(paths), m.get_input_embeddings(), Path(p)))
            for i, (m, p) in enumerate(zip(self.models, paths, strict=True))
        ]

    @torch.inference_mode()
    def run(self, prompt: Sequence[int], params: SamplingParams) -> Trace:
        seq, trace, cur = list(prompt), Trace(), 0
        req = Request(0, seq, len(prompt), params, arrival=0.0)
        while True:
            out = self.models[cur](torch.tensor([seq]), output_hidden_states=True)
            logits, hidden = out.logits[0, -1:, : self.vocab], out.hidden_states[-1][0, -1:]
            if self.constraints.apply([req], logits):
                trace.finish = FinishReason.ERROR  # the grammar allows no next token
                return trace
            ban_early_stops(logits, [params], [len(trace.tokens)], self.eos)
            token = sample(logits, [params], [len(seq)])[0]
            trace.forwards += 1
            trace.fed[cur] = len(seq)
            view = StepView(logits, hidden, torch.tensor([token]))
            route = host_routes(self.policies[cur].route([req], view))[0]
            if route.commit:
                seq.append(token)
                trace.tokens.append(token)
                trace.models.append(cur)
                if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos):
                    trace.finish = FinishReason.STOP
                elif len(trace.tokens) >= params.max_tokens:
                    trace.finish = FinishReason.LENGTH
                if trace.finish is not FinishReason.NONE:
                    return trace
            if route.dst != cur:
                self.policies[route.dst].receive(req, self.policies[cur].send(req, route.dst))
            cur = route.dst
