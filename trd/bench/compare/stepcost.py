"""The batching bound: each model's step cost measured apart from the runs it judges.

Before any system runs, each model's engine is loaded in this process (the daemon's
engine code, dtype, linears and thread count) and stepped on its own, with nothing else
running: the fastest decode step at batch sizes `BATCHES` (or the caller's) over a
context of the run's typical length, and the fastest of three one-row prefills of
`PREFILL` tokens (the fastest: a busy host only slows a step, and a slowed calibration
would flatter the run).
A step's linear layers, most of its cost, see one row per token fed, whether the tokens
are one per request or a request's unseen suffix after a handoff; so cost_m(f), the cost
of a step that fed f tokens, interpolates those points by tokens fed (and extends the
last segment past the prefill). Pricing the suffix as extra prefill tokens on top of a
one-row step instead would miss that a 2-token step can cost twice a 1-token one (BLAS
takes a matrix-vector path for one row). A daemon run's engines report how many tokens
each of their latest steps fed, and count steps exactly, so the forward time engine m
needed for the steps it ran is

    B_m = sum over its steps of cost_m(tokens fed)

and the run cannot be shorter than max_m B_m (engines in parallel) or sum_m B_m (one
shared device). Fraction = B / wall: how close the run came to what its batches cost.
Unlike the forward-only ceiling (`ceiling.py`), nothing here uses the run's own timings;
the run contributes only what it scheduled. A run of more steps than the engines' window
is scaled from the window's steps. Left out: attention's growth with the context beyond
the calibration's, and the routing policy's own work per step.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trd.bench.compare.ceiling import counter_delta
from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.protocol import SamplingParams

BATCHES = (1, 2, 4, 8, 16)
DECODE_STEPS = 8  # timed decode steps per batch size (the fastest counts)
PREFILL = 64  # prompt tokens of the prefill measurement


def _prompt(i: int, length: int, vocab: int) -> list[int]:
    return [(97 * i + 31 * j) % (vocab - 200) + 100 for j in range(length)]


def _decode_ms(engine: Engine, batch: int, context: int) -> float:
    vocab = engine.spec.checkpoint.vocab_limit
    params = SamplingParams(max_tokens=DECODE_STEPS + 2, ignore_eos=True)
    rids = {engine.add_request(_prompt(i, context, vocab), params) for i in range(batch)}
    started: set[int] = set()
    while started != rids:  # the prefill, in as many steps as the token budget takes
        started |= {o.rid for o in engine.step()}
    times = []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def _prefill_ms(engine: Engine) -> float:
    vocab = engine.spec.checkpoint.vocab_limit
    best = float("inf")
    for i in range(3):
        engine.add_request(_prompt(1000 + i, PREFILL, vocab), SamplingParams(max_tokens=1))
        start = time.perf_counter()
        engine.step()
        best = min(best, time.perf_counter() - start)
    return 1e3 * best


def calibrate(
    path: Path, dtype: str, context: int, *, batches: Sequence[int] = BATCHES, **settings: Any
) -> dict[str, Any]:
    """One model's step costs, in ms: the decode step at each batch size, and a prefill."""
    kv_tokens = (max(batches) + 1) * (context + DECODE_STEPS + PREFILL + 16)
    engine = Engine(EngineSpec.of(path, dtype=dtype, kv_tokens=kv_tokens, **settings))
    _decode_ms(engine, 1, context)  # warm-up
    points = [[b, _decode_ms(engine, b, context)] for b in batches]
    return {"decode_ms": points, "prefill_ms": [PREFILL, _prefill_ms(engine)],
            "context": context}  # fmt: skip


def step_ms(points: list[list[float]], fed: float) -> float:
    """cost(tokens fed) from the measured steps: linear between them, the last segment
    beyond. A step never costs less for feeding more tokens: a noisy measurement below
    a smaller one's is raised to it (a loaded CI host once measured the prefill below
    the widest decode, and the extension beyond went negative)."""
    xs = [p[0] for p in points]
    ys = np.maximum.accumulate([p[1] for p in points]).tolist()
    if fed <= xs[-1]:
        return float(np.interp(fed, xs, ys))
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return ys[-1] + slope * (fed - xs[-1])


def batching_bound(
    before: Mapping[str, Mapping[str, Any]],
    after: Mapping[str, Mapping[str, Any]],
    costs: Mapping[str, Mapping[str, Any]],
    wall: float,
    kind: str,
) -> dict[str, Any]:
    """The run's batching bound from its engines' counters and the calibrated costs."""
    models: dict[str, dict[str, Any]] = {}
    for name, body in after.items():
        prior = before.get(name, {})
        steps, rows, fed = (int(counter_delta(prior, body, k))
                            for k in ("steps", "rows", "tokens_fed"))  # fmt: skip
        window = [int(f) for f in body["window"]["fed"]][-steps:] if steps else []
        points = [*costs[name]["decode_ms"], costs[name]["prefill_ms"]]  # by tokens fed
        need = 1e-3 * sum(step_ms(points, f) for f in window) * steps / max(1, len(window))
        models[name] = {"steps": steps, "rows": rows, "fed": fed, "need_s": need,
                        "sampled_steps": len(window)}  # fmt: skip
    needs = [m["need_s"] for m in models.values()]
    bound_s = max(needs, default=0.0) if kind == "parallel" else sum(needs)
    return {"kind": kind, "models": models, "bound_s": bound_s,
            "fraction": bound_s / wall if wall else None}  # fmt: skip
