"""The load: conversations sent to a target, closed loop or open loop.

Conversations start in the dataset's order. Closed loop: `max_concurrency` N keeps N
conversations in flight, a finished one replaced at once by the next. Open loop:
`request_rate` R starts conversations at Poisson arrivals (exponential gaps of mean 1/R
from a seeded generator), with `max_concurrency` as a cap when both are given. Within a
conversation each turn is sent when the previous answer is in. A target is a server
(`client.Client`) or a system in this process that takes token ids (`TokenTarget`: the
research loop, the standard-serving dispatcher); both make the same records.
"""

from __future__ import annotations

import asyncio
import math
import random
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from tqdm import tqdm

from trd.bench.datasets import Conversation
from trd.bench.identity import digest_ids
from trd.bench.record import Record, completion_prompt


def arrivals(count: int, rate: float, seed: int) -> list[float]:
    """Start times (seconds) of `count` conversations: all at 0 for an infinite rate, else
    a Poisson process of `rate` per second from `seed` (the first at 0)."""
    if math.isinf(rate):
        return [0.0] * count
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


class Target(Protocol):
    """What a load runs against: a server (`Client`) or a system in this process
    (`TokenTarget`). It fills one turn's record: prompt digest, timings, output."""

    async def turn(
        self, conv: Conversation, turn: int, answers: Sequence[Record], rec: Record
    ) -> None: ...


class TokenTarget:
    """A system that takes token ids and says which model made each output token (the
    research loop, the standard-serving dispatcher): `generate` is theirs, the record
    and the conversation's prompt (`completion_prompt`) are made here as for a server."""

    def __init__(self, names: Sequence[str], max_tokens: int) -> None:
        self.names, self.max_tokens = list(names), max_tokens

    async def generate(self, ids: list[int]) -> tuple[float, float, list[int], list[int]]:
        """(TTFT s, latency s, output ids, index of the model that made each)."""
        raise NotImplementedError

    async def turn(
        self, conv: Conversation, turn: int, answers: Sequence[Record], rec: Record
    ) -> None:
        prompt = completion_prompt(conv, turn, answers)
        assert isinstance(prompt, list), "an in-process system takes token ids"
        rec.prompt, rec.prompt_ids = digest_ids(prompt), prompt
        rec.ttft, rec.latency, ids, models = await self.generate(prompt)
        rec.token_ids, rec.models = ids, [self.names[m] for m in models]
        rec.output_tokens, rec.counted_by = len(ids), "token_ids"
        rec.tokens_per_model = {n: rec.models.count(n) for n in self.names}


async def run_conversation(
    target: Target, index: int, conv: Conversation, start: float,
    bar: tqdm[Any] | None = None, pace: Mapping[tuple[int, int], float] | None = None,
) -> list[Record]:  # fmt: skip
    """Every turn of `conv`, each sent once the previous answer is in (and, with `pace`,
    not before its time in it, seconds after `start`); stops at a failed turn."""
    records: list[Record] = []
    for turn in range(len(conv.turns)):
        wait = start + (pace or {}).get((index, turn), 0.0) - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        record = Record(index, turn, "", time.perf_counter() - start)
        await target.turn(conv, turn, records, record)
        records.append(record)
        if bar is not None:
            bar.update()
        if not record.ok:
            break
    return records


async def run_load(
    target: Target, convs: Sequence[Conversation], *, max_concurrency: int | None = None,
    request_rate: float = math.inf, seed: int = 0, label: str = "",
    pace: Mapping[tuple[int, int], float] | None = None,
) -> tuple[list[Record], float]:  # fmt: skip
    """Every conversation under the load described in the module docstring; the records
    (conversation by conversation, turn by turn) and the run's wall time."""
    starts = arrivals(len(convs), request_rate, seed)
    gate = asyncio.Semaphore(max_concurrency or len(convs) or 1)
    total = sum(len(c.turns) for c in convs)
    bar = tqdm(total=total, desc=label, unit="req", leave=False, dynamic_ncols=True,
               file=sys.stderr)  # fmt: skip

    async def one(i: int) -> list[Record]:
        delay = start + starts[i] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        async with gate:
            return await run_conversation(target, i, convs[i], start, bar, pace)

    start = time.perf_counter()
    try:
        done = await asyncio.gather(*(one(i) for i in range(len(convs))))
    finally:
        bar.close()
    return [r for records in done for r in records], time.perf_counter() - start
