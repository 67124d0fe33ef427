"""Discrete-event simulation of delayed batching, independent of the Markov solver.

Requests are objects that walk between models; batch completions sit on a time
heap; latencies are continuous times in ms. Used to check the solver's
predicted throughput against a long simulated run.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

# Completions closer than this (ms) happen at the same instant: the simulated
# latencies are multiples of a 0.1 ms quantum, so sums differ only by float noise.
_SAME_INSTANT_MS = 1e-6


@dataclass
class _Request:
    tokens: float = 0.0


@dataclass
class _Model:
    threshold: int
    latency_ms: list[float]
    waiting: list[_Request] = field(default_factory=list)
    running: list[_Request] = field(default_factory=list)


def simulate(
    p: np.ndarray,
    c: np.ndarray,
    latency_ms: list[list[float]],
    n: int,
    thresholds: list[int],
    events: int,
    seed: int,
) -> float:
    """Committed tokens per second over `events` completion instants.

    latency_ms[i][b - 1] is model i's step time at batch size b. A warm-up of
    events // 10 instants runs first and is not measured; batches that finish
    at the same instant count as one.
    """
    rng = np.random.default_rng(seed)
    cumulative = np.cumsum(np.asarray(p, dtype=np.float64), axis=1).tolist()
    tokens_per_move = np.asarray(c, dtype=np.float64).tolist()
    models = [_Model(t, list(lat)) for t, lat in zip(thresholds, latency_ms, strict=True)]
    requests = [_Request() for _ in range(n)]
    models[0].waiting = list(requests)
    heap: list[tuple[float, int]] = []
    now = 0.0
    warmup = events // 10
    start_time = start_tokens = 0.0
    uniforms = rng.random(1 << 16)
    used = 0
    for count in range(events + warmup + 1):
        # Launch every idle model whose queue reached its threshold.
        for i, model in enumerate(models):
            if not model.running and len(model.waiting) >= model.threshold:
                model.running, model.waiting = model.waiting, []
                heapq.heappush(heap, (now + model.latency_ms[len(model.running) - 1], i))
        if count == warmup:
            start_time, start_tokens = now, sum(r.tokens for r in requests)
        if count == events + warmup:
            break
        now, first = heapq.heappop(heap)
        finished = [first]
        while heap and heap[0][0] - now < _SAME_INSTANT_MS:
            finished.append(heapq.heappop(heap)[1])
        for i in finished:
            batch, models[i].running = models[i].running, []
            for request in batch:
                if used == len(uniforms):
                    uniforms, used = rng.random(1 << 16), 0
                u = uniforms[used]
                used += 1
                # Last model unless u falls below an earlier cumulative probability; this
                # also absorbs a row whose cumulative sum ends at 0.9999999.
                dst = next((j for j, edge in enumerate(cumulative[i]) if u < edge), len(models) - 1)
                request.tokens += tokens_per_move[i][dst]
                models[dst].waiting.append(request)
    tokens = sum(r.tokens for r in requests) - start_tokens
    return tokens / (now - start_time) * 1000.0
