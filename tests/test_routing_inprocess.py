"""Routing engines wired in one process: every interleaving, duplicates and reorders.

The engines talk through the real codec but through Python queues, so the test can
choose any interleaving of steps and deliveries, and inject duplicated, reordered and
late messages, to the peers and to the front end. Outputs must equal the reference loop
exactly (float64), and the front end must have seen (and ignored) the duplicate Emits.
Also with models whose embedding matrices are padded differently (one tokenizer).
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from trd.engines.engine import Engine
from trd.engines.router import RoutingEngine
from trd.engines.spec import EngineSpec
from trd.ipc.names import FRONTEND
from trd.policies.base import PolicyContext
from trd.policies.factory import make_policy
from trd.protocol import (
    Done,
    Emit,
    FinishReason,
    Message,
    PeerReq,
    SamplingParams,
    Submit,
    decode,
    encode,
)
from trd.supervisor.generation import Generation
from trd.tinymodels.tokenizer import VOCAB_SIZE

from routing_cases import MODEL_SETS, jobs, prompts, reference, specs


class Wiring:
    """Engines + per-node inboxes; half the peer messages are duplicated out of order."""

    def __init__(
        self, paths: list[Path], policy: str, params: dict, seed: int, max_model_len: int = 0
    ):
        self.rng = random.Random(seed)
        self.inbox: dict[int, list[Message]] = {n: [] for n in [FRONTEND, *range(len(paths))]}
        self.engines = []
        for spec in specs(
            paths, policy, params, kv_tokens=8192, max_batch_tokens=256, max_model_len=max_model_len
        ):
            self.engines.append(self._engine(spec))
        self.tracked: dict[int, Generation] = {}
        self.injected = 0

    def _engine(self, spec: EngineSpec) -> RoutingEngine:
        eng = Engine(spec)
        ctx = PolicyContext(spec.index, spec.num_models, eng.runner.model.model.embed_tokens)
        return RoutingEngine(eng, make_policy(spec.policy, ctx), self._sender())

    def _sender(self):
        def send(node: int, msg: Message) -> None:
            copy = decode(encode(msg))
            box = self.inbox[node]
            if isinstance(copy, PeerReq | Emit) and self.rng.random() < 0.5:
                box.insert(self.rng.randrange(len(box) + 1), decode(encode(msg)))  # duplicate
                self.injected += 1
            box.append(copy)

        return send

    def submit(self, rid: int, prompt: list[int], params) -> None:
        self.tracked[rid] = Generation(rid, len(prompt))
        self.inbox[0].append(Submit(rid, np.asarray(prompt, np.int32), params))

    def tick(self) -> None:
        node = self.rng.randrange(len(self.engines))
        box = self.inbox[node]
        take = self.rng.randint(0, len(box))
        for msg in box[:take]:
            self.engines[node].inbox.handle(msg)
        del box[:take]
        if self.rng.random() < 0.7:
            self.engines[node].step()
        for msg in self.inbox[FRONTEND]:
            if isinstance(msg, Emit):
                self.tracked[msg.rid].on_emit(msg)
            elif isinstance(msg, Done):
                self.tracked[msg.rid].on_done(msg)
        self.inbox[FRONTEND].clear()
        for e in self.engines:
            e.engine.check_integrity()


CASES = [
    ("rstitch", {"threshold": 0.78}, 2),
    ("scripted", {"schedule": [1, 0, 0, 1, 1, 0]}, 2),
    ("ensemble", {"weights": [0.6, 0.4], "seed": 1}, 2),
    ("rstitch", {"threshold": 0.78}, 3),
    ("scripted", {"schedule": [2, 0, 1, 1, 0, 2, 2]}, 3),
    ("ensemble", {"weights": [0.5, 0.2, 0.3], "seed": 3}, 3),
]


@pytest.mark.parametrize("policy,params,n_models", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_interleavings_match_the_reference(
    tiny_models: dict[str, Path], policy: str, params: dict, n_models: int
) -> None:
    paths = [tiny_models[n] for n in MODEL_SETS[n_models]]
    work = jobs(paths[0])[2:10]  # the short ones: interleavings matter here, not length
    expected = reference(paths, policy, params, work)
    wiring = Wiring(paths, policy, params, seed=n_models)
    _run_all(wiring, work)
    _assert_matches(wiring, expected)
    assert wiring.injected > 0
    assert sum(g.duplicates for g in wiring.tracked.values()) > 0  # Emits came twice, ignored


def _run_all(wiring: Wiring, work: list) -> None:
    for rid, (prompt, sp) in enumerate(work):
        wiring.submit(rid, prompt, sp)
    for _ in range(200000):
        if all(t.complete and t.all_done for t in wiring.tracked.values()):
            break
        wiring.tick()


def _assert_matches(wiring: Wiring, expected: list) -> None:
    for rid, trace in enumerate(expected):
        got = wiring.tracked[rid]
        assert got.tokens == trace.tokens, f"request {rid}"
        assert got.models == trace.models, f"request {rid}"
        assert got.finish == trace.finish
        fed = {m: d.fed_tokens for m, d in got.dones.items()}
        assert fed == trace.fed, f"request {rid}: fed tokens per model"
    for e in wiring.engines:
        assert not e.requests
        alloc = e.engine.scheduler.allocator
        assert alloc.num_free == alloc.num_pages


def test_an_engine_expects_a_return_while_its_request_is_away(
    tiny_models: dict[str, Path],
) -> None:
    """What lets an idle engine poll instead of sleep: a request of its own at a peer."""
    paths = [tiny_models["small"], tiny_models["large"]]
    wiring = Wiring(paths, "scripted", {"schedule": [1, 0]}, seed=0)
    small, large = wiring.engines
    prompt, sp = jobs(paths[0])[2]
    wiring.submit(0, prompt, sp)
    assert not small.expects_return() and not large.expects_return()
    for msg in wiring.inbox[0]:
        small.inbox.handle(msg)
    wiring.inbox[0].clear()
    small.step()  # position 0 belongs to the large model: hand off
    assert small.expects_return() and not large.expects_return()
    for msg in wiring.inbox[1]:
        large.inbox.handle(msg)
    wiring.inbox[1].clear()
    large.step()  # commits position 0, hands position 1 back
    assert large.expects_return()
    for msg in wiring.inbox[0]:
        small.inbox.handle(msg)
    assert not small.expects_return()  # back and runnable: nothing of its own away


def test_a_request_that_fills_the_context_survives_a_handoff(tiny_models: dict[str, Path]) -> None:
    # The peer counted the committed output as prompt, so prompt + max_tokens == context
    # (the chat default: max_tokens = what the context leaves) failed at the first handoff.
    paths = [tiny_models["small"], tiny_models["large"]]
    wiring = Wiring(paths, "scripted", {"schedule": [0, 0, 1]}, seed=0, max_model_len=32)
    wiring.submit(0, list(range(5, 13)), SamplingParams(max_tokens=24, ignore_eos=True))
    for _ in range(20000):
        if wiring.tracked[0].complete:
            break
        wiring.tick()
    got = wiring.tracked[0]
    assert (got.finish, got.error, len(got.tokens)) == (FinishReason.LENGTH, "", 24)
    assert set(got.models) == {0, 1}


PAD_ROWS = 64


@pytest.fixture(scope="module")
def padded_small(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture small, its (tied) embedding padded from 2048 to 2048 + 64 rows, as
    Qwen pads 151665 ids to 151936 rows. Each padding row is twice the row of one of the
    corpus's 64 commonest tokens, so unmasked it would outscore that token wherever the
    token's logit is positive: padding that greedy decoding would pick, if it could."""
    out = tmp_path_factory.mktemp("padded") / "small"
    shutil.copytree(tiny_models["small"], out)
    weights = load_file(out / "model.safetensors")
    embed = weights["model.embed_tokens.weight"]
    counts = Counter(t for p in prompts(out, 64) for t in p)
    common = torch.tensor([t for t, _ in counts.most_common(PAD_ROWS)])
    weights["model.embed_tokens.weight"] = torch.cat([embed, 2 * embed[common]])
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "vocab_size": VOCAB_SIZE + PAD_ROWS}))
    return out


PADDED_CASES = [("rstitch", {"threshold": 0.78}), ("scripted", {"schedule": [1, 0, 0, 1, 1, 0]})]


@pytest.mark.parametrize("policy,params", PADDED_CASES)
def test_padded_vocabularies_route_exactly_and_never_emit_padding(
    tiny_models: dict[str, Path], padded_small: Path, policy: str, params: dict
) -> None:
    paths = [padded_small, tiny_models["large"]]  # 2112 and 2048 rows, one tokenizer
    work = jobs(paths[0])[2:8]
    ref = AutoModelForCausalLM.from_pretrained(padded_small, dtype=torch.float64).eval()
    with torch.no_grad():
        raw = ref(torch.tensor([work[0][0]])).logits[0]
    assert raw.shape[1] == VOCAB_SIZE + PAD_ROWS and (raw.argmax(-1) >= VOCAB_SIZE).any()
    expected = reference(paths, policy, params, work)
    wiring = Wiring(paths, policy, params, seed=5)
    _run_all(wiring, work)
    _assert_matches(wiring, expected)
    outputs = [t for g in wiring.tracked.values() for t in g.tokens]
    assert outputs and max(outputs) < VOCAB_SIZE
    switches = {(a, b) for g in wiring.tracked.values() for a, b in itertools.pairwise(g.models)}
    assert {(0, 1), (1, 0)} <= switches  # handoffs both ways
