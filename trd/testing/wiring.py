"""Routing engines wired in one process through queues (the real codec, chosen interleavings).

`Wiring` steps random engines, delivers random amounts of their inboxes, and duplicates
half the peer messages and Emits, inserted out of order; `run_all` drives a workload to
the end; `assert_matches` compares it with reference-loop traces (tokens, producers,
finish, tokens fed per model) and checks that every engine freed every page.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from trd.engines.loop import build
from trd.ipc.names import FRONTEND
from trd.protocol import Done, Emit, Message, PeerReq, Submit, decode, encode
from trd.supervisor.generation import Generation

from routing_cases import specs


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
            self.engines.append(build(spec, self._sender()))
        self.tracked: dict[int, Generation] = {}
        self.injected = 0

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


def run_all(wiring: Wiring, work: list) -> None:
    for rid, (prompt, sp) in enumerate(work):
        wiring.submit(rid, prompt, sp)
    for _ in range(200000):
        if all(t.complete and t.all_done for t in wiring.tracked.values()):
            break
        wiring.tick()


def assert_matches(wiring: Wiring, expected: list) -> None:
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
