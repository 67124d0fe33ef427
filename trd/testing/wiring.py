"""Routing engines wired in one process through queues (the real codec), for comparing
their tokens with the reference loop's (`trd.testing.reference`) or with known outputs.

`Wiring(specs)` runs every engine in turn, each reading its whole inbox and stepping:
what the GPU check and `tokenrouterd eval demo|calibrate` use. `Wiring(specs, seed=n)` chooses the
interleavings: it steps random engines, delivers random amounts of their inboxes,
duplicates half the peer messages and Emits, inserted out of order, and checks every
engine's integrity after each step (the routing tests). `run` drives a workload to the
end (`concurrency` at a time, or all at once); `assert_matches` compares it with
reference-loop traces (tokens, producers, finish, tokens fed or taken from the prefix
cache per model) and checks that every engine freed every page.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
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
from trd.supervisor.group import prefill_ahead, submit_to
from trd.testing.reference import Trace

Job = tuple[list[int], SamplingParams]
Make = Callable[[EngineSpec, Callable[[int, Message], None]], RoutingEngine]


class Wiring:
    """Engines + per-node inboxes; with a seed, interleavings chosen by it and half the
    peer messages duplicated out of order."""

    def __init__(
        self, specs: Sequence[EngineSpec], seed: int | None = None, make: Make = build
    ) -> None:
        """`make(spec, send)` builds each node (default: a new engine with its policy; the
        GPU benchmark's policy check puts new policies on engines it already loaded)."""
        self.rng = None if seed is None else random.Random(seed)
        self.inbox: dict[int, list[Message]] = {n: [] for n in [FRONTEND, *range(len(specs))]}
        self.engines: list[RoutingEngine] = [make(spec, self._send) for spec in specs]
        self.ahead = prefill_ahead(specs)
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
        for node in submit_to(params, self.ahead):  # as the engine group sends it
            self.inbox[node].append(Submit(rid, np.asarray(prompt, np.int32), params))

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

    def run(
        self, work: Sequence[Job], concurrency: int = 0, ticks: int = 200_000
    ) -> list[Generation]:
        """Submit the jobs (request ids 0, 1, ...; at most `concurrency` unfinished, 0: all
        at once) and tick until each request is complete and every engine is done with
        it; the generations in request order."""
        first = len(self.tracked)
        rids = range(first, first + len(work))
        done = lambda g: g.complete and g.all_done  # noqa: E731
        for _ in range(ticks):
            mine = [self.tracked[rid] for rid in rids if rid in self.tracked]
            busy = sum(not done(g) for g in mine)
            for rid in rids[len(mine) :][: concurrency - busy if concurrency else None]:
                self.submit(rid, *work[rid - first])
            if len(mine) == len(work) and all(map(done, mine)):
                return mine
            self.tick()
        raise RuntimeError("the routed workload did not finish")

    def hits(self) -> dict[int, int]:
        """Tokens each engine took from its prefix cache so far."""
        caches = {m: e.engine.scheduler.cache for m, e in enumerate(self.engines)}
        return {m: c.counters.hit_tokens for m, c in caches.items() if c is not None}


def assert_matches(wiring: Wiring, expected: Sequence[Trace]) -> None:
    for rid, trace in enumerate(expected):
        got = wiring.tracked[rid]
        assert got.tokens == trace.tokens, f"request {rid}"
        assert got.models == trace.models, f"request {rid}"
        assert got.finish == trace.finish
    check_fed([wiring.tracked[rid] for rid in range(len(expected))], expected, wiring.hits())
    for e in wiring.engines:
        assert not e.requests
        alloc = e.engine.scheduler.allocator
        assert alloc.num_free == alloc.num_pages  # cached pages are all evictable


def check_fed(
    results: Sequence[Generation], expected: Sequence[Trace], hits: dict[int, int]
) -> None:
    """Each model fed or took from its prefix cache every token of the sequence it ran
    on exactly once: never the full context again on a return, never a cached token again.

    `hits`: tokens each model matched in its cache over these requests."""
    skipped: dict[int, int] = {}
    for i, (got, want) in enumerate(zip(results, expected, strict=True)):
        fed = {m: d.fed_tokens for m, d in got.dones.items()}
        assert fed.keys() == want.fed.keys(), f"request {i}: models {fed} vs {want.fed}"
        assert all(fed[m] <= want.fed[m] for m in fed), f"request {i}: {fed} vs {want.fed}"
        for m, n in fed.items():
            skipped[m] = skipped.get(m, 0) + want.fed[m] - n
    assert skipped == {m: hits.get(m, 0) for m in skipped}, f"skipped {skipped}, hits {hits}"
