"""Routing on the device: a routing step reads tensors back to the host exactly once (the
sampled tokens, finite flags, destinations and commit flags, stacked), whatever the
batch; counted by wrapping torch's own tensor-to-host methods around a real engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trd.engines.engine import Engine
from trd.engines.router import RoutingEngine
from trd.engines.spec import EngineSpec
from trd.policies.base import PolicyContext
from trd.policies.factory import make_policy
from trd.policies.heads import save_random_head
from trd.policies.params import PolicySpec
from trd.protocol import Message, SamplingParams, Submit

from r2r_reference import build

READS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


@pytest.fixture
def host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Names of the tensor-to-host calls made while the fixture is active."""
    calls: list[str] = []
    for name in READS:
        real = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *a: Any, _real: Any = real, _n: str = name) -> Any:
            calls.append(_n)
            return _real(self, *a)

        monkeypatch.setattr(torch.Tensor, name, counted)
    yield calls


def routing_engine(path: Path, policy: str, params: dict[str, Any]) -> RoutingEngine:
    spec = EngineSpec.of(path, num_models=2, kv_tokens=2048, policy=PolicySpec(policy, params))
    engine = Engine(spec)
    ctx = PolicyContext(0, 2, engine.runner.model.model.embed_tokens, spec.checkpoint.path)
    sent: list[tuple[int, Message]] = []
    node = RoutingEngine(engine, make_policy(spec.policy, ctx), lambda n, m: sent.append((n, m)))
    prompts = ([5, 6, 7], [8, 9], [10, 11, 12, 13], [14] * 9)
    for rid, prompt in enumerate(prompts):
        params_ = SamplingParams(
            max_tokens=4, ignore_eos=True, temperature=0.7 * (rid % 2), seed=rid
        )
        node.inbox.handle(Submit(rid, np.asarray(prompt, np.int32), params_))
    return node


@pytest.mark.parametrize(
    ("policy", "params"),
    [
        ("rstitch", {"threshold": 0.97}),
        ("scripted", {"schedule": [0, 0, 1]}),
        ("glimp", {"threshold": 2.8, "step_tokens": 2}),  # the step state stays on the host
    ],
)
def test_a_routing_step_reads_the_device_once(
    tiny_models: dict[str, Path], policy: str, params: dict[str, Any], host_reads: list[str]
) -> None:
    node = routing_engine(tiny_models["small"], policy, params)
    steps = 0
    while True:
        host_reads.clear()
        if not node.step():
            break
        steps += 1
        assert host_reads == ["tolist"], f"step {steps}: {host_reads}"
    assert steps >= 2


def test_a_learned_router_also_reads_the_device_once(
    tiny_models: dict[str, Path], tmp_path: Path, host_reads: list[str]
) -> None:
    """R2R's features (hidden state, sampled token's embedding, top logits) and its head
    run on the device; its escalations come back with the tokens."""
    head = save_random_head(tmp_path / "r2r.safetensors", "r2r", 2 * 64 + 4, 16, seed=1, top_k=4)
    node = routing_engine(tiny_models["small"], "r2r", {"head": str(head), "threshold": 0.5})
    host_reads.clear()
    assert node.step()
    assert host_reads == ["tolist"]
    assert len(node.requests) == 4  # none failed: the head ran, on every row


def test_a_published_r2r_router_also_reads_the_device_once(
    tiny_models: dict[str, Path], tmp_path: Path, host_reads: list[str]
) -> None:
    path = tmp_path / "router.pt"
    build(path, [32] * 6, normalize=True)
    node = routing_engine(tiny_models["small"], "r2r", {"head": str(path)})
    host_reads.clear()
    assert node.step()
    assert host_reads == ["tolist"]
    assert len(node.requests) == 4
