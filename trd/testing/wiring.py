"""Routing engines wired in one process through queues (the real codec), for comparing
their tokens with the reference loop's (`trd.testing.reference`) or with known outputs.

`Wiring(specs)` runs every engine in turn, each reading its whole inbox and stepping:
what the GPU check and scripts/demo_quality.py use. `Wiring(specs, seed=n)` chooses the
interleavings: it steps random engines, delivers random amounts of their inboxes,
duplicates half the peer messages and Emits, inserted out of order, and checks every
engine's integrity after each step (the routing tests). `run` drives a workload to the
end; `assert_matches` compares it with reference-loop traces (tokens, producers, finish,
tokens fed per model) and checks that every engine freed every page.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trd.engines.loop import build
from trd.engines.router import RoutingEngine
from trd.engines.spec import EngineSpec
from trd.ipc.names import FRONTEND
from trd.policies.params import PolicySpec
from trd.protocol import Done, Emit, Message, PeerReq, SamplingParams, Submit, decode, encode
from trd.supervisor.generation import Generation
from trd.testing.reference import Trace

Job = tuple[list[int], SamplingParams]


class Wiring:
    """Engines + per-node inboxes; with a seed, interleavings chosen by it and half the
    peer messages duplicated out of order."""

    def __init__(self, specs: Sequence[EngineSpec], seed: int | None = None) -> None:
        self.rng = None if seed is None else random.Random(seed)
        self.inbox: dict[int, list[Message]] = {n: [] for n in [FRONTEND, *range(len(specs))]}
        self.engines: list[RoutingEngine] = [build(spec, self._send) for spec in specs]
        self.tracked: dict[int, Generation] = {}
        self.injected = 0

    @classmethod
    def of(cls, paths: Sequence[Path], policy: PolicySpec, **spec: Any) -> Wiring:
        """Engines of `paths` (0 = small, ...) routed by `policy`, with EngineSpec.of's
        settings, each in turn."""
        n = len(paths)
        specs = [
            EngineSpec.of(p, index=i, num_models=n, policy=policy, **spec)
            for i, p in enumerate(paths)
        ]
        return cls(specs)

    def _send(self, node: int, msg: Message) -> None:
        copy = decode(encode(msg))
        box = self.inbox[node]
        if self.rng and isinstance(copy, PeerReq | Emit) and self.rng.random() < 0.5:
            box.insert(self.rng.randrange(len(box) + 1), decode(encode(msg)))  # duplicate
            self.injected += 1
        box.append(copy)

    def submit(self, rid: int, prompt: list[int], params: SamplingParams) -> None:
        self.tracked[rid] = Generation(rid, len(prompt))
        self.inbox[0].append(Submit(rid, np.asarray(prompt, np.int32), params))

    def tick(self) -> None:
        """Seeded: one random engine reads part of its inbox and maybe steps; else every
        engine reads its whole inbox and steps. Then the front end reads its own."""
        if self.rng is None:
            for node in range(len(self.engines)):
                self._deliver(node, len(self.inbox[node]))
                self.engines[node].step()
        else:
            node = self.rng.randrange(len(self.engines))
            self._deliver(node, self.rng.randint(0, len(self.inbox[node])))
            if self.rng.random() < 0.7:
                self.engines[node].step()
        for msg in self.inbox[FRONTEND]:
            if isinstance(msg, Emit):
                self.tracked[msg.rid].on_emit(msg)
            elif isinstance(msg, Done):
                self.tracked[msg.rid].on_done(msg)
        self.inbox[FRONTEND].clear()
        if self.rng is not None:
            for e in self.engines:
                e.engine.check_integrity()

    def _deliver(self, node: int, take: int) -> None:
        box = self.inbox[node]
        for msg in box[:take]:
            self.engines[node].inbox.handle(msg)
        del box[:take]

    def run(self, work: Sequence[Job], ticks: int = 200_000) -> list[Generation]:
        """Submit every job (request ids 0, 1, ...) and tick until each request is complete
        and every engine is done with it; the generations in request order."""
        first = len(self.tracked)
        for rid, (prompt, params) in enumerate(work, start=first):
            self.submit(rid, prompt, params)
        mine = [self.tracked[rid] for rid in range(first, first + len(work))]
        for _ in range(ticks):
            if all(g.complete and g.all_done for g in mine):
                return mine
            self.tick()
        raise RuntimeError("the routed workload did not finish")


def assert_matches(wiring: Wiring, expected: Sequence[Trace]) -> None:
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
