"""A request that breaks something fails alone: the engine serves the rest of its batch.

Extreme but valid sampling values must not break anything at all (temperature 1e-45
overflowed float32 logits and sampling indexed with -1 before); a fault inside the
forward, the policy, a message or a handoff fails only the request it belongs to.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from trd.engines.engine import Engine
from trd.engines.outbound import FINISHED_MEMORY, PeerGone
from trd.engines.router import RoutingEngine
from trd.engines.runner import ForwardOutput
from trd.engines.sampler import sample
from trd.engines.scheduler import Scheduled
from trd.engines.spec import EngineSpec
from trd.ipc.names import FRONTEND
from trd.policies.base import PolicyContext, RequestView, Routes, StepView
from trd.policies.factory import make_policy
from trd.policies.params import PolicySpec
from trd.protocol import (
    Abort,
    Emit,
    FinishReason,
    Message,
    PeerKind,
    PeerReq,
    SamplingParams,
    Submit,
)

PROMPTS = [[60, 61, 62], [70, 71, 72, 73], [80, 81]]
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def spec(tiny_models: dict[str, Path]) -> EngineSpec:
    return EngineSpec.of(tiny_models["small"], kv_tokens=1024, num_models=2)


@pytest.fixture(scope="module")
def alone(spec: EngineSpec) -> list[list[int]]:
    """Each prompt's greedy output with nothing failing around it."""
    return Engine(spec).generate(PROMPTS, GREEDY)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1e-45, seed=3),
        SamplingParams(temperature=1e-38, top_p=1e-9, seed=2**63 - 1),
        SamplingParams(temperature=2.0, top_k=2**32 - 1, seed=0),
        SamplingParams(temperature=1e-6, top_k=1, seed=5),
    ],
)
def test_extreme_sampling_values_pick_a_real_token(params: SamplingParams) -> None:
    logits = torch.tensor([[1e30, -1e30, 3.0, float("-inf")], [0.0, 0.0, 0.0, 0.0]])
    tokens = sample(logits, [params, params], [0, 1])
    assert tokens[0] == 0  # 1e30 holds all the mass at any temperature
    assert 0 <= tokens[1] < 4


def test_near_zero_temperature_is_greedy_in_the_engine(spec: EngineSpec) -> None:
    engine = Engine(spec)
    cold = SamplingParams(max_tokens=6, ignore_eos=True, temperature=1e-45, seed=1)
    greedy = engine.generate(PROMPTS, GREEDY)
    assert engine.generate(PROMPTS, cold) == greedy


def fail_forward_of(engine: Engine, prompt: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner raises whenever the request with this prompt is in the batch."""
    real = engine.runner.forward

    def forward(batch: list[Scheduled]) -> ForwardOutput:
        if any(item.req.seq[: len(prompt)] == prompt for item in batch):
            raise RuntimeError("CUDA error: an illegal memory access (simulated)")
        return real(batch)

    monkeypatch.setattr(engine.runner, "forward", forward)


def run(engine: Engine, prompts: list[list[int]]) -> dict[int, Any]:
    rids = [engine.add_request(p, GREEDY) for p in prompts]
    out: dict[int, Any] = {rid: [] for rid in rids}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finish is FinishReason.ERROR:
                out[o.rid] = o.error
            else:
                out[o.rid].append(o.token)
    engine.check_integrity()
    assert engine.scheduler.allocator.num_free == engine.scheduler.allocator.num_pages
    return out


def test_a_forward_failing_for_one_request_fails_only_that_one(
    spec: EngineSpec, alone: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(spec)
    fail_forward_of(engine, PROMPTS[1], monkeypatch)
    outs = list(run(engine, PROMPTS).values())
    assert outs[0] == alone[0] and outs[2] == alone[2]
    assert "forward failed: CUDA error" in outs[1]


def test_non_finite_logits_fail_only_their_request(
    spec: EngineSpec, alone: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = Engine(spec)
    real = engine.runner.forward

    def forward(batch: list[Scheduled]) -> ForwardOutput:
        out = real(batch)
        with torch.inference_mode():
            for i, item in enumerate(out.items):
                if item.req.seq[:2] == PROMPTS[2][:2]:
                    out.logits[i, 5] = float("nan")
        return out

    monkeypatch.setattr(engine.runner, "forward", forward)
    outs = list(run(engine, PROMPTS).values())
    assert outs[:2] == alone[:2]
    assert "non-finite logits" in outs[2]


class Wire:
    """What a routing engine sends, by destination; one destination can be made unreachable."""

    def __init__(self, gone: set[int] | None = None) -> None:
        self.sent: list[tuple[int, Message]] = []
        self.gone = gone or set()

    def __call__(self, node: int, msg: Message) -> None:
        if node in self.gone:
            raise PeerGone(f"model {node} is gone")
        self.sent.append((node, msg))

    def errors(self) -> dict[int, str]:
        return {
            m.rid: m.error
            for n, m in self.sent
            if n == FRONTEND and isinstance(m, Emit) and m.finish is FinishReason.ERROR
        }


def routing(spec: EngineSpec, schedule: list[int], wire: Wire) -> RoutingEngine:
    engine = Engine(spec)
    ctx = PolicyContext(0, 2, engine.runner.model.model.embed_tokens)
    policy = make_policy(PolicySpec("scripted", {"schedule": schedule}), ctx)
    node = RoutingEngine(engine, policy, wire)
    for rid, prompt in enumerate(PROMPTS):
        node.inbox.handle(Submit(rid, np.asarray(prompt, np.int32), GREEDY))
    return node


def test_a_policy_failing_for_one_request_fails_only_that_one(
    spec: EngineSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    wire = Wire()
    node = routing(spec, [0], wire)
    real = node.policy.route

    def route(reqs: Sequence[RequestView], view: StepView) -> Routes:
        if any(r.rid == 1 for r in reqs):
            raise ValueError("router head returned NaN (simulated)")
        return real(reqs, view)

    monkeypatch.setattr(node.policy, "route", route)
    while node.step():
        pass
    assert list(wire.errors()) == [1]
    assert "routing policy failed: ValueError" in wire.errors()[1]
    finished = [
        m.rid for _, m in wire.sent if isinstance(m, Emit) and m.finish is FinishReason.LENGTH
    ]
    assert sorted(finished) == [0, 2]
    assert node.engine.scheduler.allocator.num_free == node.engine.scheduler.allocator.num_pages


def test_a_handoff_that_cannot_be_delivered_fails_the_request_and_frees_its_pages(
    spec: EngineSpec,
) -> None:
    wire = Wire(gone={1})
    node = routing(spec, [0, 1], wire)  # position 1 belongs to model 1, which is gone
    while node.step():
        pass
    assert sorted(wire.errors()) == [0, 1, 2]
    assert all("model 1 is not reachable" in e for e in wire.errors().values())
    assert not node.requests and not node.expects_return()
    assert node.engine.scheduler.allocator.num_free == node.engine.scheduler.allocator.num_pages


def test_a_message_that_cannot_apply_fails_its_request_only(spec: EngineSpec) -> None:
    wire = Wire()
    node = routing(spec, [0, 1], wire)
    node.step()  # every request commits position 0 and is handed to model 1
    assert not any(isinstance(m, Emit) and m.finish for _, m in wire.sent)
    bad = PeerReq(
        0, 99, PeerKind.HANDOFF, 0, np.asarray([1, 2, 3], np.int32), 3, None, b"", 0.0,
        np.asarray([0, 0], np.uint32),
    )  # fmt: skip
    node.inbox.handle(bad)  # disagrees with the committed prompt of request 0
    assert list(wire.errors()) == [0]
    assert "handoff disagrees with the committed tokens" in wire.errors()[0]
    assert sorted(node.requests) == [1, 2]


def test_min_tokens_keeps_stop_ids_out_until_enough_tokens(spec: EngineSpec) -> None:
    engine = Engine(spec)
    first = engine.generate([PROMPTS[0]], SamplingParams(max_tokens=1))[0][0]
    stop_at_once = SamplingParams(max_tokens=8, stop_token_ids=(first,))
    assert engine.generate([PROMPTS[0]], stop_at_once) == [[first]]
    held = SamplingParams(max_tokens=8, stop_token_ids=(first,), min_tokens=3)
    (out,) = engine.generate([PROMPTS[0]], held)
    assert len(out) >= 3 and first not in out[:3]


def test_a_handoff_arriving_after_its_abort_never_revives_the_request(spec: EngineSpec) -> None:
    wire = Wire()
    node = routing(spec, [0], wire)
    node.inbox.handle(Abort(7))  # the client left before the request ever reached this engine
    first = PeerReq(
        7, 1, PeerKind.HANDOFF, 0, np.asarray(PROMPTS[0], np.int32), 3, GREEDY, b"", 0.0,
        np.asarray([0, 3], np.uint32),
    )  # fmt: skip
    node.inbox.handle(first)
    assert 7 not in node.requests and not wire.errors()
    for rid in range(100, 100 + FINISHED_MEMORY + 10):  # the memory is bounded
        node.out.remember(rid)
    assert len(node.out.finished) == FINISHED_MEMORY and 7 not in node.out.finished
