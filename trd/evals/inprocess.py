"""A pair run in this process, as the daemon runs it: one model alone on our `Engine`, or
both routed (`RoutingEngine`s handing requests to each other through in-memory inboxes,
`trd.testing.wiring`); and a response's likelihood under a model (transformers, one
forward over prompt + response). For the evaluations that need no daemon: `eval demo`,
`eval calibrate`, `eval routing`'s judge."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.supervisor.generation import Generation
from trd.testing.wiring import Wiring

KV_TOKENS = 16384


def alone(path: Path, prompts: Sequence[list[int]], max_tokens: int, dtype: str) -> list[list[int]]:
    """Each prompt's greedy answer by the model at `path` alone."""
    engine = Engine(EngineSpec.of(path, dtype=dtype, kv_tokens=KV_TOKENS))
    return engine.generate(prompts, SamplingParams(max_tokens=max_tokens))


def routed(paths: Sequence[Path], policy: PolicySpec, prompts: Sequence[list[int]],
           max_tokens: int, dtype: str) -> list[Generation]:  # fmt: skip
    """Each prompt's greedy answer by the pair routed by `policy`: its tokens and the
    model of each (0 = small)."""
    pair = Wiring.of(paths, policy, dtype=dtype, kv_tokens=KV_TOKENS)
    return pair.run([(list(p), SamplingParams(max_tokens=max_tokens)) for p in prompts])


def large_share(answers: Sequence[Generation]) -> float:
    """The share of all the answers' tokens the large model (any but 0) produced."""
    models = [m for g in answers for m in g.models]
    return sum(m > 0 for m in models) / max(1, len(models))


@torch.inference_mode()
def response_nll(model: torch.nn.Module, prompt: list[int], response: list[int]) -> float:
    """Sum of -log p over the response's tokens after the prompt, under `model` (a
    transformers causal LM), in nats; the logits in float32."""
    if not response:
        return 0.0
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return -float(logp.gather(1, torch.tensor(response).unsqueeze(1)).sum())
