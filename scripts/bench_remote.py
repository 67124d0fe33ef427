"""Throughput and handoff latency with the large model here vs on another host.

    python scripts/bench_remote.py [--policy rstitch|scripted] [--n 4] [--requests 48]

The same closed loop (N requests in flight over the tiny fixture pair, float32) runs
through engine groups built from one config, as the daemon builds them:

    local   both engines on this host, shared-memory rings only
    remote  the large engine behind `tokenrouterd engine` in a network namespace,
            joined by a veth pair (link-local addresses): its frames cross a bridge on
            each side and one TCP connection

Both groups stay up and take turns (--repeats), so background load falls on both alike.
Prints tokens/s of each run, the remote/local ratio of the medians, and handoff latency
p50/p99 in each direction (send -> the receiving engine has it, as the engines measure
it; over the link the wire part is half the heartbeats' round trip). Needs root for the
namespace; on two real hosts the bridges run on different machines, here all processes
share this one's cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trd.bench import server
from trd.bench.engines import make_jobs, run_closed_loop
from trd.bench.server import daemon_config, launch_engine_host
from trd.bench.stats import percentile, summary
from trd.config import load_config
from trd.supervisor.deployment import plan_deployment
from trd.supervisor.group import EngineGroup
from trd.testing.netns import NetNs, why_not
from trd.testing.tinymodels.build import ensure_models

NAMES = ("small", "large")
PORT = 7070
TOKEN = "bench-remote-token-0123456789"
POLICIES: dict[str, dict[str, Any]] = {
    "rstitch": {"name": "rstitch", "threshold": 0.82},  # ~ a quarter of tokens from large
    "scripted": {"name": "scripted", "schedule": [0, 0, 1, 0, 1, 1]},  # a handoff per ~2
}


def write_config(
    folder: Path, models: dict[str, Path], policy: str, spin_ms: float, remote: str | None
) -> Path:
    engine = {"threads": 1, "max_batch_tokens": 512, "spin_ms": spin_ms}
    cfg = daemon_config(models, POLICIES[policy], kv_tokens=16384, max_model_len=1024,
                        engine=engine, remote_token=TOKEN,
                        per_model={"large": {"remote": remote}} if remote else None)  # fmt: skip
    return server.write_config(cfg, folder / ("remote.yaml" if remote else "local.yaml"))


def started(config: Path, jobs: list[Any], n: int) -> EngineGroup:
    group = EngineGroup(plan_deployment(load_config(config)).specs)
    group.start(timeout=300)
    run_closed_loop(group, jobs[: 2 * n], n)  # warm-up
    return group


def measure(group: EngineGroup, jobs: list[Any], n: int) -> dict[str, Any]:
    start = time.perf_counter()
    results = run_closed_loop(group, jobs, n)
    wall = time.perf_counter() - start
    time.sleep(0.6)  # one more Stats from each engine
    group.pump()
    stats = {m: group.stats.get(m, {}) for m in (0, 1)}
    assert all(not r.error for r in results), [r.error for r in results if r.error]
    lat: dict[int, list[float]] = {0: [], 1: []}  # by the receiving engine
    for r in results:
        for model, done in r.dones.items():
            lat[model] += done.handoff_latencies.tolist()
    tokens = sum(len(r.tokens) for r in results)
    return {
        "tok_s": tokens / wall, "tokens": tokens, "wall_s": wall,
        "large_fraction": sum(m == 1 for r in results for m in r.models) / tokens,
        "handoffs": len(lat[0]) + len(lat[1]),
        "small_to_large_us": summary(lat[1], 1e6), "large_to_small_us": summary(lat[0], 1e6),
        "batch_mean": {name: stats[m].get("batch_size_mean") for m, name in enumerate(NAMES)},
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", choices=sorted(POLICIES), default="rstitch")
    p.add_argument("--n", type=int, default=4, help="requests in flight")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2, help="local/remote pairs, alternating")
    p.add_argument("--spin-ms", type=float, default=20.0, help="engine.spin_ms of both runs")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()
    reason = why_not()
    if reason is not None:
        print(f"bench_remote: needs network namespaces (root): {reason}", file=sys.stderr)
        return 2
    models = ensure_models(names=("small", "large"))
    jobs = make_jobs(models["small"], args.requests, args.max_tokens)
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "remote": []}
    with NetNs() as ns, tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp:
        folder = Path(tmp)
        local = write_config(folder, models, args.policy, args.spin_ms, None)
        remote = write_config(folder, models, args.policy, args.spin_ms, f"{ns.peer_ip}:{PORT}")
        host = launch_engine_host(remote, "large", f"{ns.peer_ip}:{PORT}", folder, ns.command)
        host.up(300)
        groups: dict[str, EngineGroup] = {}
        try:
            # Both groups stay up (idle engines sleep) and take turns, so the machine's
            # background load falls on both alike.
            groups = {
                "local": started(local, jobs, args.n),
                "remote": started(remote, jobs, args.n),
            }
            for _ in range(args.repeats):
                for mode, group in groups.items():
                    r = measure(group, jobs, args.n)
                    runs[mode].append(r)
                    s2l, l2s = r["small_to_large_us"], r["large_to_small_us"]
                    print(f"{mode:6s} {r['tok_s']:7.1f} tok/s  large {r['large_fraction']:.0%}  "
                          f"handoff us small->large p50 {s2l['p50']:.0f} p99 {s2l['p99']:.0f}, "
                          f"large->small p50 {l2s['p50']:.0f} p99 {l2s['p99']:.0f}; "
                          f"mean batch {r['batch_mean']}", flush=True)  # fmt: skip
        finally:
            for group in groups.values():
                group.close()
            host.stop(30)
    med = {m: percentile((r["tok_s"] for r in rs), 50) for m, rs in runs.items()}
    ratio = med["remote"] / med["local"]
    print(f"median tok/s: local {med['local']:.1f}, remote {med['remote']:.1f}: "
          f"remote/local = {ratio:.3f} ({(ratio - 1) * 100:+.1f}%)")  # fmt: skip
    if args.json:
        out = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
               "median_tok_s": med, "ratio": ratio}  # fmt: skip
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
