"""The research-code baseline: a per-request Python loop over Hugging Face models.

What the R2R and CITER repositories do: every model is a transformers model with its
own KV cache (a `DynamicCache` per request and model); requests run one at a time;
after each forward the routing policy picks the model for the next position, and a
model that gets the request back first catches its cache up on the tokens it has not
seen. The policy is the daemon's own decision function on the same logits, so greedy
outputs match the daemon's token for token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from trd.engines.request import Request
from trd.engines.sampler import sample
from trd.policies.base import PolicyContext, RoutingPolicy, StepView, host_routes
from trd.policies.factory import make_policy
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams


def _load(path: Path, dtype: torch.dtype, device: str) -> PreTrainedModel:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    # transformers decorates PreTrainedModel.to with functools.wraps(nn.Module.to), whose
    # stub (functools._Wrapped) binds no self: mypy would take the device for `self`.
    to = cast(Callable[[str], PreTrainedModel], model.to)
    return to(device).eval()


@dataclass
class Output:
    tokens: list[int] = field(default_factory=list)
    models: list[int] = field(default_factory=list)  # producer of each token
    ttft: float = 0.0
    latency: float = 0.0


class OfficialRouter:
    def __init__(
        self,
        paths: Sequence[Path],
        policy: str,
        params: dict[str, Any],
        dtype: str = "float32",
        device: str = "cpu",
    ) -> None:
        self.device = torch.device(device)
        self.models = [_load(p, getattr(torch, dtype), device) for p in paths]
        self.policies: list[RoutingPolicy] = [
            make_policy(
                PolicySpec(policy, params),
                PolicyContext(i, len(paths), m.get_input_embeddings(), Path(p)),
            )
            for i, (m, p) in enumerate(zip(self.models, paths, strict=True))
        ]

    @torch.inference_mode()
    def generate(self, prompt: Sequence[int], params: SamplingParams) -> Output:
        """One request to its end; EOS is not checked (the workloads ignore it)."""
        start = time.perf_counter()
        seq, out, cur = list(prompt), Output(), 0
        caches = [DynamicCache() for _ in self.models]
        req = Request(0, seq, len(prompt), params, arrival=0.0)
        while len(out.tokens) < params.max_tokens:
            seen = caches[cur].get_seq_length()
            feed = torch.tensor([seq[seen:]], device=self.device)
            res = self.models[cur](
                feed, cache=caches[cur], use_cache=True, output_hidden_states=True
            )
            logits, hidden = res.logits[0, -1:], res.hidden_states[-1][0, -1:]
            token = sample(logits, [params], [len(seq)])[0]
            view = StepView(logits, hidden, torch.tensor([token], device=self.device))
            route = host_routes(self.policies[cur].route([req], view))[0]
            if route.commit:
                seq.append(token)
                out.tokens.append(token)
                out.models.append(cur)
                if len(out.tokens) == 1:
                    out.ttft = time.perf_counter() - start
            cur = route.dst
        out.latency = time.perf_counter() - start
        return out
