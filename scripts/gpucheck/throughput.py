"""Throughput of the shaped pair through engine processes, CUDA graphs on vs off.

    python -m gpucheck.throughput OUT.json

Closed loop at N = 1 and 16 (2N requests, at least 4; 64-token prompts, 128 output
tokens), a scripted schedule giving the 8B-shaped model every fourth position (25%), each
engine in its own process as the daemon runs them (without MPS: mps.py checks that
part). Every request's tokens must be the ones the shaped weights make under the
schedule (trd/testing/shaped.py `expected_tokens`). The dry run: N = 1, 2, 8 output tokens, once.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from gpucheck.common import DEVICE, DRY_RUN, DTYPE, dump, first_mismatch, log, model_path
from trd.bench.engines import run_closed_loop
from trd.engines.spec import EngineSpec
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.supervisor.group import EngineGroup
from trd.testing.shaped import expected_tokens

LEVELS = (1, 2) if DRY_RUN else (1, 16)
SCHEDULE = [0, 0, 0, 1]  # the large model makes 25% of the tokens
PROMPT, OUTPUT = (16, 8) if DRY_RUN else (64, 128)
Job = tuple[list[int], SamplingParams]


def work(count: int) -> list[Job]:
    params = SamplingParams(max_tokens=OUTPUT, ignore_eos=True)
    return [([(11 * i + 3 * j) % 2000 + 20 for j in range(PROMPT)], params) for i in range(count)]


def specs(graphs: bool) -> list[EngineSpec]:
    policy = PolicySpec("scripted", {"schedule": SCHEDULE})
    return [
        EngineSpec.of(model_path(which), index=i, num_models=2, policy=policy, dtype=DTYPE,
                      device=DEVICE, kv_tokens=32768, cuda_graphs=graphs)
        for i, which in enumerate(("small", "large"))
    ]  # fmt: skip


def engines(graphs: bool) -> tuple[dict[str, Any], bool]:
    start = time.perf_counter()
    group = EngineGroup(specs(graphs))
    group.start(timeout=240)
    rows: dict[str, Any] = {"start_s": round(time.perf_counter() - start, 1)}
    exact = True
    try:
        for n in LEVELS:
            jobs = work(max(2 * n, 4))
            begin = time.perf_counter()
            gens = run_closed_loop(group, jobs, n, timeout=120)
            wall = time.perf_counter() - begin
            tokens = sum(len(g.tokens) for g in gens)
            want = [expected_tokens(p, sp.max_tokens, SCHEDULE) for p, sp in jobs]
            mismatch = first_mismatch([g.tokens for g in gens], want)
            exact = exact and not mismatch
            rows[str(n)] = {"tok_s": round(tokens / wall, 1), "requests": len(jobs),
                            "errors": [g.error for g in gens if g.error][:3],
                            "mismatch": mismatch}  # fmt: skip
            log(f"graphs {'on ' if graphs else 'off'} N={n:2}: {rows[str(n)]}")
    finally:
        group.close()
    return rows, exact


def main() -> None:
    result: dict[str, Any] = {"schedule": SCHEDULE, "prompt": PROMPT, "output": OUTPUT}
    ok = True
    for graphs in (True,) if DRY_RUN else (True, False):  # the same code either way
        result[f"graphs_{'on' if graphs else 'off'}"], exact = engines(graphs)
        ok = ok and exact
    dump(sys.argv[1], {"ok": ok, **result})


if __name__ == "__main__":
    main()
