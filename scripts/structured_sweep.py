#!/usr/bin/env python3
"""Run `structured_bench.py` on every policy of a pair, one daemon per policy in turn.

    scripts/structured_sweep.py --small DIR --large DIR --heads ROUTERS_DIR --out DIR \
        r2r:16:constrained,streamed,unconstrained r2r:1:constrained small:16:...

Each step is POLICY:N:PASSES. POLICY is one of POLICIES (the learned ones read
HEADS_DIR/<policy>.safetensors at the threshold the head chose; `small` is the small
model alone, the control without routing). Consecutive steps of one policy share its
daemon, so a later pass finds the earlier passes' prompts in the prefix cache (compare
passes after the first). The daemons are configured as the HumanEval runs'
(`hevalkit.systems.base_config`: bfloat16, CPU) with one torch thread per engine and two
when every request is on one engine. Prints structured_bench's table rows.
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hevalkit.systems import HEADS, base_config

from benchkit.systems import free_port, start_daemon

HERE = Path(__file__).resolve().parent
POLICIES: dict[str, tuple[dict[str, Any], str]] = {
    "rstitch": ({"name": "rstitch", "threshold": 0.3}, "rstitch 0.3"),
    "glimp": ({"name": "glimp", "threshold": 0.9}, "glimp 0.9"),
    "ensemble": ({"name": "ensemble", "weights": [0.8, 0.2]}, "ensemble 0.8/0.2"),
    "r2r": ({"name": "r2r"}, "r2r (head)"),
    "citer": ({"name": "citer"}, "citer (head)"),
    "collm": ({"name": "collm"}, "collm (head)"),
    "small": ({"name": "rstitch"}, "0.5B alone"),
}


def config(base: dict[str, Any], policy: str, heads: Path | None) -> dict[str, Any]:
    cfg = copy.deepcopy(base)
    cfg |= {"listen": f"127.0.0.1:{free_port()}", "admin": f"127.0.0.1:{free_port()}"}
    cfg["engine"] = {"threads": 1, "threads_alone": 2}
    cfg["policy"] = dict(POLICIES[policy][0])
    if policy in HEADS:
        if heads is None:
            raise SystemExit(f"{policy} needs --heads (tokenrouterd train-router)")
        cfg["policy"]["head"] = str(heads / f"{policy}.safetensors")
    if policy == "small":
        cfg["models"] = cfg["models"][:1]
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=Path, required=True)
    ap.add_argument("--large", type=Path, required=True)
    ap.add_argument("--heads", type=Path, help="train-router's output folder")
    ap.add_argument("--out", type=Path, default=Path("structured_runs"), help="daemon logs")
    ap.add_argument("steps", nargs="+", help="POLICY:N:PASSES")
    args = ap.parse_args()
    base = base_config(None, args.small, args.large)
    current, daemon = "", None
    try:
        for step in args.steps:
            policy, n, passes = step.split(":")
            if policy not in POLICIES:
                raise SystemExit(f"{step}: the policy must be one of {', '.join(POLICIES)}")
            if policy != current:
                if daemon is not None:
                    daemon.server.stop()
                folder = args.out / policy
                folder.mkdir(parents=True, exist_ok=True)
                started = time.monotonic()
                daemon = start_daemon(policy, config(base, policy, args.heads), folder)
                current = policy
                print(f"# {policy}: ready in {time.monotonic() - started:.0f} s", flush=True)
            assert daemon is not None
            bench = [sys.executable, str(HERE / "structured_bench.py"), "--url", daemon.server.url,
                     "--label", POLICIES[policy][1], "--n", n, "--passes", passes]  # fmt: skip
            subprocess.run(bench, check=True)
    finally:
        if daemon is not None:
            daemon.server.stop()


if __name__ == "__main__":
    main()
