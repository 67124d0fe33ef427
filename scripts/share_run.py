#!/usr/bin/env python3
"""The large model's share held at a target on a pair: a run of the real daemon.

Starts the daemon on the pair with R-Stitch at a threshold far from the target and
`policy.target_large_share`, sends a mixed chat workload (three output lengths, a third
of the requests sampled) from CLIENTS threads through the openai client, and every
SAMPLE_S reads the admin API's share (target, measured, threshold in force) and the
engines' committed-token counters. Prints the time the share first came within
TOLERANCE of the target and, from then on, the share of every WINDOW_S window of
committed tokens; writes every sample to --out (JSON).

    .venv/bin/python scripts/share_run.py --pair demo --target 0.2 --seconds 300
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import openai

from trd.bench.chat_prompts import CHAT_PROMPTS
from trd.bench.compare.pairs import PAIRS, load_pair
from trd.bench.compare.systems import daemon_config
from trd.bench.server import serve_config

CLIENTS = 8
SAMPLE_S = 2.0
WINDOW_S = 20.0
TOLERANCE = 0.03
MODEL = "small+large"


def request(rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": rng.choice(CHAT_PROMPTS)}],
        "max_tokens": rng.choice((32, 96, 192)),
        "temperature": 0,
    }
    if rng.random() < 1 / 3:
        body |= {"temperature": 0.8, "seed": rng.randrange(1 << 30)}
    return body


def clients(url: str, stop: threading.Event, errors: list[str]) -> list[threading.Thread]:
    def loop(seed: int) -> None:
        rng = random.Random(seed)
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        while not stop.is_set():
            try:
                api.chat.completions.create(**request(rng))
            except Exception as exc:  # counted and reported at the end
                errors.append(repr(exc))

    return [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(CLIENTS)]


def windows(samples: list[dict[str, Any]], since: float) -> list[float]:
    """The large model's share of the tokens committed in each WINDOW_S after `since`."""
    held = [s for s in samples if s["t"] >= since]
    out, start = [], held[0] if held else None
    for s in held[1:]:
        assert start is not None
        if s["t"] - start["t"] >= WINDOW_S and s["total"] > start["total"]:
            out.append((s["large"] - start["large"]) / (s["total"] - start["total"]))
            start = s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pair", choices=PAIRS, default="demo")
    ap.add_argument("--target", type=float, default=0.2, help="target large-model share")
    ap.add_argument("--start-threshold", type=float, default=0.9, help="R-Stitch tau at start")
    ap.add_argument("--seconds", type=float, default=300.0, help="length of the run")
    ap.add_argument("--out", type=Path, default=Path("bench_results/share_run.json"))
    args = ap.parse_args()
    pair = load_pair(args.pair)
    cfg = daemon_config(pair.models, args.start_threshold, {}, kv_tokens=32768, context=1024)
    cfg["policy"]["target_large_share"] = args.target
    daemon = serve_config("share_run", cfg, Path(tempfile.mkdtemp(prefix="share-run-")))
    stop = threading.Event()
    errors: list[str] = []
    threads = clients(daemon.url, stop, errors)
    samples: list[dict[str, Any]] = []
    try:
        for t in threads:
            t.start()
        start = time.monotonic()
        while time.monotonic() - start < args.seconds:
            time.sleep(SAMPLE_S)
            status = daemon.admin_call("GET", "/status")
            counts = [e["tokens_committed"] or 0 for e in status["engines"]]
            samples.append({"t": time.monotonic() - start, "large": counts[-1],
                            "total": sum(counts), **status["share"]})  # fmt: skip
            s = samples[-1]
            print(f"{s['t']:6.0f} s  measured {s['measured'] or 0:.3f}  threshold"
                  f" {s['threshold'] or 0:.4f}  moves {s['moves']}", flush=True)  # fmt: skip
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)
        daemon.stop()
    reached = next(
        (s["t"] for s in samples if s["measured"] is not None
         and abs(s["measured"] - args.target) <= TOLERANCE), None,
    )  # fmt: skip
    shares = windows(samples, reached) if reached is not None else []
    worst = max((abs(x - args.target) for x in shares), default=None)
    result = {"pair": args.pair, "target": args.target, "reached_s": reached,
              "window_s": WINDOW_S, "window_shares": shares, "worst_window_error": worst,
              "errors": len(errors), "samples": samples}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"target {args.target:.1%}: within {TOLERANCE:.0%} after {reached} s; shares of"
          f" {WINDOW_S:.0f} s windows since: {', '.join(f'{x:.1%}' for x in shares)};"
          f" worst {worst}; {len(errors)} failed requests; wrote {args.out}")  # fmt: skip
    if errors:
        print("first errors:", errors[:3])


if __name__ == "__main__":
    main()
