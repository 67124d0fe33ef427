"""Throughput of the 0.6B/8B-shaped pair through engine processes, graphs on vs off.

    python -m gpucheck.throughput OUT.json

Closed loop at N = 1, 4, 16 (2N requests, at least 8; 64-token prompts, 128 output
tokens), a scripted schedule giving the 8B every fourth position (25%), each engine in
its own process as the daemon runs them (without MPS: mps.py checks that part). The
official-style loop (scripts/baselines/official.py: transformers, one request at a time,
a KV cache per model) runs 4 of the requests as the reference; its tokens must equal the
engines' (the shaped weights leave no near ties).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch

from gpucheck.common import SHAPED, dump, log
from trd.engines.spec import EngineSpec
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.supervisor.group import EngineGroup, run_closed_loop

from baselines.official import OfficialRouter

LEVELS = (1, 4, 16)
SCHEDULE = [0, 0, 0, 1]  # the large model makes 25% of the tokens
PROMPT, OUTPUT = 64, 128
Job = tuple[list[int], SamplingParams]


def work(count: int) -> list[Job]:
    params = SamplingParams(max_tokens=OUTPUT, ignore_eos=True)
    return [([(11 * i + 3 * j) % 2000 + 20 for j in range(PROMPT)], params) for i in range(count)]


def specs(graphs: bool) -> list[EngineSpec]:
    policy = PolicySpec("scripted", {"schedule": SCHEDULE})
    return [
        EngineSpec.of(path, index=i, num_models=2, policy=policy, dtype="bfloat16",
                      device="cuda", kv_tokens=65536, cuda_graphs=graphs)
        for i, path in enumerate((SHAPED["small"], SHAPED["large"]))
    ]  # fmt: skip


def engines(graphs: bool) -> tuple[dict[str, Any], list[list[int]]]:
    start = time.perf_counter()
    group = EngineGroup(specs(graphs))
    group.start(timeout=240)
    rows: dict[str, Any] = {"start_s": round(time.perf_counter() - start, 1)}
    first: list[list[int]] = []
    try:
        for n in LEVELS:
            jobs = work(max(2 * n, 8))
            begin = time.perf_counter()
            gens = run_closed_loop(group, jobs, n, timeout=120)
            wall = time.perf_counter() - begin
            tokens = sum(len(g.tokens) for g in gens)
            large = sum(m == 1 for g in gens for m in g.models) / max(tokens, 1)
            errors = [g.error for g in gens if g.error]
            rows[str(n)] = {"tok_s": round(tokens / wall, 1), "large_share": round(large, 3),
                            "requests": len(jobs), "errors": errors[:3]}  # fmt: skip
            log(f"  graphs {'on ' if graphs else 'off'} N={n:2}: {rows[str(n)]}")
            first = first or [g.tokens for g in gens[:4]]
    finally:
        group.close()
    return rows, first


def official(jobs: list[Job]) -> tuple[dict[str, Any], list[list[int]]]:
    paths = [SHAPED["small"], SHAPED["large"]]
    ref = OfficialRouter(paths, "scripted", {"schedule": SCHEDULE}, dtype="bfloat16", device="cuda")
    ref.generate(jobs[0][0], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs = [ref.generate(p, sp) for p, sp in jobs]
    wall = time.perf_counter() - start
    return {"tok_s": round(sum(len(o.tokens) for o in outs) / wall, 1)}, [o.tokens for o in outs]


def main() -> None:
    out_path = sys.argv[1]
    result: dict[str, Any] = {"schedule": SCHEDULE, "prompt": PROMPT, "output": OUTPUT}
    firsts = {}
    for graphs in (True, False):
        result[f"graphs_{'on' if graphs else 'off'}"], firsts[graphs] = engines(graphs)
    result["official"], ref_tokens = official(work(4))
    log(f"  official-style loop: {result['official']}")
    result["tokens_equal_official"] = firsts[True] == ref_tokens == firsts[False]
    ok = result["tokens_equal_official"] and all(
        not row["errors"] for g in ("graphs_on", "graphs_off")
        for key, row in result[g].items() if key != "start_s"
    )  # fmt: skip
    dump(out_path, {"ok": ok, **result})


if __name__ == "__main__":
    main()
