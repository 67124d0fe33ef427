"""Benchmark tokenrouterd against the baselines a user would pick instead -> JSON.

Systems, all on the same fixture models (small + large, float32), the same R-Stitch
threshold and the same greedy requests:

    tokenrouterd          the daemon, delayed-batching thresholds from its Markov model
    official              research-code loop: HF models, own KV caches, one request at a time
    std                   one standard server per model + a token-by-token HTTP dispatcher;
                          the servers keep a prefix cache (as vLLM and SGLang do)
    std_nocache           the same, stateless servers: every call re-prefills its context
    no_delayed_batching   tokenrouterd with every threshold at 1
    no_pending_kv         tokenrouterd freeing a request's KV when it leaves an engine
    step_sync             tokenrouterd with a global barrier between engine steps
    forced_delay          tokenrouterd with the large model's threshold forced to 4 at N >= 8

Each system's outputs are compared with tokenrouterd's on the same prompts (identical
text is required for greedy decoding). The whole report:

    .venv/bin/python scripts/bench.py --out bench_results/all.json
    .venv/bin/python scripts/bench_report.py bench_results/all.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from trd.tinymodels.build import ensure_models

from benchkit.plan import PLANS
from benchkit.runner import Bench
from benchkit.workloads import WORKLOADS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--plan", choices=sorted(PLANS), default="full")
    ap.add_argument("--tau", type=float, default=0.8, help="R-Stitch entropy threshold")
    ap.add_argument("--cache-dir", type=Path, help="fixture model cache (default: ~/.cache)")
    ap.add_argument("--out", type=Path, default=Path("bench_results/all.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)  # the engines under test need the other cores
    models = ensure_models(args.cache_dir, names=("small", "large"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    logs = args.out.parent / "logs"
    logs.mkdir(exist_ok=True)
    bench = Bench(PLANS[args.plan], models, args.tau, logs)
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "plan": args.plan,
        "tau": args.tau,
        "workloads": {k: asdict(w) for k, w in WORKLOADS.items()},
        **asyncio.run(bench.run_all()),
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
