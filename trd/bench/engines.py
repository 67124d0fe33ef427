"""`tokenrouterd bench engines`: token routing across engine processes (no HTTP, no
daemon) against the reference loop; `run_closed_loop` drives an engine group.

Closed loop: N requests in flight (a finished one is replaced at once) over the
small+large fixtures with R-Stitch; for each output length the threshold is bisected
until the large model makes about 25% (--large-fraction) of the tokens of 8 calibration
requests (the issue asks for 10-40%). Reports tokens/s, the large model's
token fraction, handoffs per request, handoff latency (send -> runnable on the peer,
excluding time the peer was still busy with a step of its own: forward, routing and
sends), and the reference loop's tokens/s on the same workload.

    tokenrouterd bench engines [--n 1,4,16] [--max-tokens 128,512] [--out FILE]

`--thresholds` then runs N=16 twice more with the same requests: once with all
delayed-batching thresholds at 1, then with the Markov model's recommendation computed
from the live measurements of that first run, and reports the throughput ratio and
per-request TPOT of both.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from trd.batching.live import recommend_live
from trd.bench.result import Result
from trd.bench.stats import percentile
from trd.engines.spec import BatchingSettings, EngineSpec
from trd.evals.calibrate import bisect
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.supervisor.generation import Generation
from trd.supervisor.group import EngineGroup
from trd.testing.reference import ReferenceRouter
from trd.testing.tinymodels.build import ensure_models
from trd.testing.tinymodels.corpus import corpus

Job = tuple[list[int], SamplingParams]
CALIBRATION_STEPS, CALIBRATION_SLACK = 7, 0.03
MAX_WAIT_MS = BatchingSettings().max_wait_ms


def make_jobs(tok_dir: Path, count: int, max_tokens: int, prompt_len: int = 64) -> list[Job]:
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    docs = [d for d in corpus("heldout") if len(d) > 4 * prompt_len]
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return [(tok.encode(docs[i % len(docs)]).ids[:prompt_len], params) for i in range(count)]


def run_closed_loop(
    group: EngineGroup,
    jobs: Sequence[tuple[Sequence[int], SamplingParams]],
    concurrency: int,
    timeout: float = 600.0,
) -> list[Generation]:
    """Keep `concurrency` jobs in flight (a finished one is replaced at once); in job order.

    A job is complete when its tokens are in and every engine that held it has
    reported freeing it (so per-engine work counts are final).
    """
    results: list[Generation | None] = [None] * len(jobs)
    inflight: dict[int, int] = {}
    nxt = 0
    deadline = time.monotonic() + timeout
    while nxt < len(jobs) or inflight:
        while nxt < len(jobs) and len(inflight) < concurrency:
            inflight[group.submit(*jobs[nxt]).rid] = nxt
            nxt += 1
        group.set_active(len(inflight))
        group.pump(timeout=0.05)
        for rid in list(inflight):
            gen = group.gens[rid]
            if gen.complete and (gen.all_done or gen.error):
                group.forget(rid)
                results[inflight.pop(rid)] = gen
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(inflight)} requests still in flight after {timeout} s")
    return [r for r in results if r is not None]


def calibrate(paths: list[Path], max_tokens: int, target: float) -> tuple[float, float]:
    """Bisect the R-Stitch threshold (`trd.evals.calibrate.bisect`) until the large model
    makes about `target` of the tokens of 8 workload requests (run through the engines
    at N=8); (tau, fraction)."""
    probe = make_jobs(paths[0], 8, max_tokens)

    def share_at(tau: float) -> float:
        group = EngineGroup(rstitch_specs(paths, tau))
        group.start()
        try:
            results = run_closed_loop(group, probe, 8)
        finally:
            group.close()
        return float(summarize(results, 1.0)["large_fraction"])

    return bisect(share_at, target, 0.5, 1.0, CALIBRATION_STEPS, CALIBRATION_SLACK)


def summarize(results: list[Generation], wall: float) -> dict[str, Any]:
    tokens = sum(len(r.tokens) for r in results)
    tpots = [t for r in results if (t := r.tpot) is not None]
    large = sum(m == 1 for r in results for m in r.models)
    lat = sorted(x for r in results for d in r.dones.values() for x in d.handoff_latencies.tolist())
    handoffs = len(lat)
    return {
        "tokens": tokens,
        "tok_s": tokens / wall,
        "large_fraction": large / tokens,
        "handoffs_per_request": handoffs / len(results),
        "handoff_us_p50": 1e6 * percentile(lat, 50) if lat else 0.0,
        "handoff_us_p99": 1e6 * percentile(lat, 99) if lat else 0.0,
        "tpot_ms_p50": 1e3 * percentile(tpots, 50) if tpots else 0.0,
    }


def compare_thresholds(group: EngineGroup, jobs: list[Job], n: int) -> dict[str, Any]:
    """All-ones vs the Markov recommendation from the all-ones run's live figures."""
    for spec in group.specs:
        body = {"op": "set_thresholds", "thresholds": [1], "max_wait_ms": MAX_WAIT_MS}
        group.control(spec.index, body)
    start = time.perf_counter()
    ones = summarize(run_closed_loop(group, jobs, n), time.perf_counter() - start)
    time.sleep(1.0)  # let every engine publish its latest window
    group.pump(timeout=0.1)
    rec = recommend_live(group.stats, levels=(1, 2, 4, 8, n))
    for spec in group.specs:
        table = rec["table"][spec.index]
        body = {"op": "set_thresholds", "thresholds": table, "max_wait_ms": MAX_WAIT_MS}
        group.control(spec.index, body)
    start = time.perf_counter()
    tuned = summarize(run_closed_loop(group, jobs, n), time.perf_counter() - start)
    return {
        "n": n,
        "recommended_table": rec["table"],
        "recommended_at_n": next(lv for lv in rec["levels"] if lv["n"] == n),
        "all_ones": ones,
        "recommended": tuned,
        "throughput_ratio": tuned["tok_s"] / ones["tok_s"],
    }


def run_reference(paths: list[Path], tau: float, jobs: list[Job]) -> dict[str, Any]:
    ref = ReferenceRouter(paths, PolicySpec("rstitch", {"threshold": tau}), dtype="float32")
    start = time.perf_counter()
    traces = [ref.run(p, sp) for p, sp in jobs]
    wall = time.perf_counter() - start
    return {"tok_s": sum(len(t.tokens) for t in traces) / wall, "requests": len(jobs)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tokenrouterd bench engines", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    ap.add_argument("--n", default="1,4,16", help="closed-loop concurrency levels")
    ap.add_argument("--max-tokens", default="128,512", help="output lengths")
    ap.add_argument("--requests", type=int, default=2, help="requests per unit of N (min 8)")
    ap.add_argument(
        "--large-fraction", type=float, default=0.25, help="calibrate tau to this large share"
    )
    ap.add_argument("--tau", type=float, help="use this R-Stitch threshold, no calibration")
    ap.add_argument("--ref-requests", type=int, default=3, help="requests for the reference")
    ap.add_argument("--thresholds", action="store_true", help="compare Markov thresholds at N=16")
    ap.add_argument("--out", type=Path, default=Path("results/engines.json"))
    args = ap.parse_args(argv)
    command = ["tokenrouterd", "bench", "engines", *(sys.argv[3:] if argv is None else argv)]
    out = Result("bench engines", command)
    torch.set_num_threads(1)
    models = ensure_models(names=("small", "large"))
    paths = [models["small"], models["large"]]
    levels = [int(x) for x in args.n.split(",")]
    lengths = [int(x) for x in args.max_tokens.split(",")]
    rows: list[dict[str, Any]] = []
    taus: dict[int, float] = {}
    cmp: dict[str, Any] | None = None
    print(HEADER)
    for max_tokens in lengths:
        # Later positions are easier, so each output length gets its own threshold.
        if args.tau is None:
            tau, frac = calibrate(paths, max_tokens, args.large_fraction)
            print(f"max_tokens {max_tokens}: tau {tau:.4f} gives {100 * frac:.0f}% large "
                  "tokens on the calibration requests", flush=True)  # fmt: skip
        else:
            tau = args.tau
        taus[max_tokens] = tau
        group = EngineGroup(rstitch_specs(paths, tau))
        group.start()
        try:
            ref = run_reference(paths, tau, make_jobs(paths[0], args.ref_requests, max_tokens))
            for n in levels:
                jobs = make_jobs(paths[0], max(8, args.requests * n), max_tokens)
                start = time.perf_counter()
                results = run_closed_loop(group, jobs, n)
                row = {
                    "n": n,
                    "max_tokens": max_tokens,
                    "tau": tau,
                    **summarize(results, time.perf_counter() - start),
                }
                row["reference_tok_s"] = ref["tok_s"]
                row["speedup_vs_reference"] = row["tok_s"] / ref["tok_s"]
                rows.append(row)
                print_row(row)
            if args.thresholds and max_tokens == lengths[0]:
                cmp = compare_thresholds(group, make_jobs(paths[0], 32, max_tokens), 16)
        finally:
            group.close()
    if cmp is not None:
        for label in ("all_ones", "recommended"):
            r = cmp[label]
            print(f"N=16 {label:12} {r['tok_s']:8.1f} tok/s  TPOT p50 {r['tpot_ms_p50']:.2f} ms")
        print(f"recommended table {cmp['recommended_table']}, "
              f"ratio {cmp['throughput_ratio']:.3f}")  # fmt: skip
    out.system("engines", {"models": {"small": str(paths[0]), "large": str(paths[1])},
                           "policy": "rstitch", "kv_tokens": 65536, "threads": 1})  # fmt: skip
    out.add(taus=taus, runs=rows, thresholds=cmp)
    print(f"rstitch tau per output length {taus}; wrote {out.write(args.out)}")
    return 0


def rstitch_specs(paths: list[Path], tau: float) -> list[EngineSpec]:
    policy = PolicySpec("rstitch", {"threshold": tau})
    return [
        EngineSpec.of(p, index=i, num_models=2, policy=policy, kv_tokens=65536, threads=1)
        for i, p in enumerate(paths)
    ]


HEADER = (
    f"{'N':>3} {'max_tok':>7} {'tok/s':>8} {'large%':>7} {'hand/req':>8} "
    f"{'p50 us':>8} {'p99 us':>9} {'TPOT ms':>7} {'ref tok/s':>9} {'speedup':>7}"
)


def print_row(r: dict[str, Any]) -> None:
    print(
        f"{r['n']:>3} {r['max_tokens']:>7} {r['tok_s']:8.1f} {100 * r['large_fraction']:6.1f}% "
        f"{r['handoffs_per_request']:8.1f} {r['handoff_us_p50']:8.0f} {r['handoff_us_p99']:9.0f} "
        f"{r['tpot_ms_p50']:7.2f} "
        f"{r['reference_tok_s']:9.1f} {r['speedup_vs_reference']:7.1f}",
        flush=True,
    )
