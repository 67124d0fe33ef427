"""One policy's threshold sweep on real engine processes, and the measures of each point.

A policy's engines start once; each threshold is installed live (the Control message
the daemon's share control sends, confirmed by every engine's Stats) before its run:
the evaluation prompts at concurrency N, greedy. Sweep points that leave a target share
uncovered get refined points (`refinements`). Per point:

    large_share       tokens the large model produced / all tokens
    handoffs_per_req  handoffs received by any engine, per request (from the Done reports)
    identical         fraction of responses equal, token for token, to large-only greedy
    nll               mean per-token negative log-likelihood of the responses under the
                      large model (teacher-forced, float32), in nats
    tok_s             committed tokens per second of wall time, N requests in flight
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from trd.bench.engines import run_closed_loop
from trd.engines.spec import EngineSpec
from trd.evals.inprocess import response_nll
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.supervisor.group import EngineGroup

Job = tuple[list[int], SamplingParams]
CONFIRM_S = 30.0
REFINE_GAP = 0.04  # a point within this of a target share covers it
REFINE_ROUNDS = 2


@dataclass
class Point:
    policy: str  # the curve's label
    threshold: float | None
    large_share: float
    handoffs_per_req: float
    identical: float
    nll: float
    tok_s: float
    tokens: int
    seconds: float


def group_for(paths: Sequence[Path], policy: PolicySpec, cpu_linear: str) -> EngineGroup:
    specs = [
        EngineSpec.of(p, index=i, num_models=len(paths), policy=policy, dtype="float32",
                      kv_tokens=16 * 1024, max_batch_size=32, cpu_linear=cpu_linear)
        for i, p in enumerate(paths)
    ]  # fmt: skip
    group = EngineGroup(specs)
    group.start(timeout=300)
    return group


def install_threshold(group: EngineGroup, tau: float) -> None:
    """Send the threshold to every engine; return once each one's Stats report it."""
    for i in range(len(group.procs)):
        group.control(i, {"op": "set_policy_threshold", "threshold": tau})
    deadline = time.monotonic() + CONFIRM_S
    while any(
        group.stats.get(i, {}).get("policy_threshold") != tau for i in range(len(group.procs))
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the engines did not confirm threshold {tau} in {CONFIRM_S} s")
        group.pump(timeout=0.05)


class Judge:
    """The large model's view of a response: large-only output and per-token NLL."""

    def __init__(self, large: Path, jobs: list[Job], reference: list[list[int]]) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(large, dtype=torch.float32).eval()
        self.jobs, self.reference = jobs, reference
        self.cache: dict[tuple[int, ...], tuple[float, int]] = {}

    @torch.inference_mode()
    def nll(self, prompt: list[int], response: list[int]) -> tuple[float, int]:
        """(sum of -log p over the response's tokens, their count)."""
        key = (*prompt, -1, *response)
        if key not in self.cache:
            self.cache[key] = (response_nll(self.model, prompt, response), len(response))
        return self.cache[key]

    def point(self, label: str, tau: float | None, gens: list[Any], seconds: float) -> Point:
        tokens = sum(len(g.tokens) for g in gens)
        large = sum(sum(1 for m in g.models if m > 0) for g in gens)
        handoffs = sum(len(d.handoff_latencies) for g in gens for d in g.dones.values())
        same = sum(g.tokens == ref for g, ref in zip(gens, self.reference, strict=True))
        total, count = 0.0, 0
        for (prompt, _), g in zip(self.jobs, gens, strict=True):
            s, n = self.nll(prompt, g.tokens)
            total, count = total + s, count + n
        return Point(label, tau, large / tokens, handoffs / len(gens), same / len(gens),
                     total / count, tokens / seconds, tokens, seconds)  # fmt: skip


def run(group: EngineGroup, jobs: list[Job], concurrency: int) -> tuple[list[Any], float]:
    start = time.perf_counter()
    gens = run_closed_loop(group, jobs, concurrency)
    for g in gens:
        if g.error:
            raise RuntimeError(f"request {g.rid:x} failed: {g.error}")
    return gens, time.perf_counter() - start


def sweep(
    paths: Sequence[Path],
    label: str,
    policy: PolicySpec,
    taus: list[float],
    jobs: list[Job],
    judge: Judge,
    concurrency: int,
    cpu_linear: str,
    targets: Sequence[float] = (),
) -> list[dict[str, Any]]:
    """The points of `taus`, then (REFINE_ROUNDS times) one more for each target share
    no point came within REFINE_GAP of, at the threshold interpolated between the two
    measured points around it: so curves compare at equal shares, not across gaps."""
    group = group_for(paths, policy, cpu_linear)
    points: list[Point] = []

    def measure(tau: float) -> None:
        install_threshold(group, tau)
        gens, seconds = run(group, jobs, concurrency)
        point = judge.point(label, tau, gens, seconds)
        print(f"{label:14} tau {tau:10.6g} large {point.large_share:6.3f} identical "
              f"{point.identical:5.2f} nll {point.nll:6.3f} handoffs/req "
              f"{point.handoffs_per_req:6.1f} {point.tok_s:7.1f} tok/s", flush=True)  # fmt: skip
        points.append(point)

    try:
        for tau in taus:
            measure(tau)
        for _ in range(REFINE_ROUNDS):
            for tau in refinements(points, targets):
                measure(tau)
    finally:
        group.close()
    return [asdict(p) for p in points]


def refinements(points: list[Point], targets: Sequence[float]) -> list[float]:
    """Thresholds interpolated (linearly in share) toward the targets not yet covered."""
    pts = sorted((p for p in points if p.threshold is not None), key=lambda p: p.large_share)
    out = []
    for s in targets:
        if any(abs(p.large_share - s) <= REFINE_GAP for p in pts):
            continue
        for a, b in itertools.pairwise(pts):
            if a.large_share < s < b.large_share:
                assert a.threshold is not None and b.threshold is not None
                f = (s - a.large_share) / (b.large_share - a.large_share)
                out.append(a.threshold + f * (b.threshold - a.threshold))
                break
    return out
