"""Soak test: many short requests against a real daemon, resident memory per process.

    .venv/bin/python scripts/soak.py --requests 50000 --concurrency 8

Starts the daemon on the tiny fixture pair (`--demo tiny`), sends short completions
from `--concurrency` client threads, and every `--every` requests prints the resident
set size (VmRSS) of the supervisor and of each engine process, then the growth per
request between the first sample after warm-up and the last. Writes a JSON result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trd.bench.server import launch

ROOT = Path(__file__).resolve().parent.parent


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry))
    return out


def post(url: str, body: bytes) -> None:
    req = urllib.request.Request(
        f"{url}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=50_000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--every", type=int, default=2_000, help="sample memory this often")
    ap.add_argument("--warmup", type=int, default=2_000, help="requests before the baseline")
    ap.add_argument("--out", type=Path, default=ROOT / "bench_results" / "soak.json")
    args = ap.parse_args()
    argv = [sys.executable, "-m", "trd.daemon", "--demo", "tiny", "--port", "0"]
    daemon = launch("soak", argv, Path(tempfile.mkdtemp(prefix="soak-")))
    try:
        daemon.up(600)
        engines = [p for p in children(daemon.proc.pid) if "spawn_main" in _cmdline(p)]
        body = json.dumps({"model": "small+large", "prompt": "def f(x):", "max_tokens": 4,
                           "temperature": 0}).encode()  # fmt: skip
        done = 0
        lock = threading.Lock()
        samples: list[dict[str, int]] = []
        start = time.monotonic()

        def one(_: int) -> None:
            nonlocal done
            post(daemon.url, body)
            with lock:
                done += 1
                if done % args.every == 0:
                    sample = {"requests": done, "supervisor": rss_kib(daemon.proc.pid)}
                    sample.update({f"engine{i}": rss_kib(p) for i, p in enumerate(engines)})
                    samples.append(sample)
                    print(json.dumps(sample), flush=True)

        with ThreadPoolExecutor(args.concurrency) as pool:
            list(pool.map(one, range(args.requests)))
        wall = time.monotonic() - start
    finally:
        daemon.stop()
    base = next(s for s in samples if s["requests"] >= args.warmup)
    last = samples[-1]
    span = last["requests"] - base["requests"]
    growth = {k: 1024 * (last[k] - base[k]) / max(1, span) for k in base if k != "requests"}
    print(f"{args.requests} requests in {wall:.0f} s ({args.requests / wall:.0f} req/s)")
    for name, per in growth.items():
        print(f"{name:10} {base[name] / 1024:8.1f} -> {last[name] / 1024:8.1f} MiB, "
              f"{per:7.1f} B/request after {base['requests']} requests")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"samples": samples, "growth_bytes_per_request": growth}))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


if __name__ == "__main__":
    main()
