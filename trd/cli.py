"""trctl: look at and steer a running tokenrouterd through its admin API.

    trctl status [--json]                         engines, memory, queues, rates, thresholds,
                                                  the large-model share control if set
    trctl thresholds                              the delayed-batching thresholds
    trctl thresholds --set small=1 large=1,2,4 [--max-wait-ms 20]    change them live
    trctl thresholds --recommend [--apply]        the Markov model's choice from live figures

The admin API listens on loopback or a unix socket: --admin 127.0.0.1:8001 or
--admin unix:/run/tokenrouterd/admin.sock (default: $TRCTL_ADMIN, else 127.0.0.1:8001).
With `admin_token` in the daemon's config, give it with --token or $TRCTL_ADMIN_TOKEN,
or let --config FILE read the address and the token from the daemon's config.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from trd import version

DEFAULT_ADMIN = "127.0.0.1:8001"
TIMEOUT_S = 120.0  # a recommendation solves Markov chains


class AdminError(RuntimeError):
    """The admin API could not be reached or answered with an error."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=TIMEOUT_S)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(self.path)


def request(admin: str, method: str, path: str, body: Any = None, token: str = "") -> Any:
    """One admin call; the decoded JSON answer, or AdminError saying what went wrong."""
    if admin.startswith("unix:"):
        conn: http.client.HTTPConnection = _UnixConnection(admin[len("unix:") :])
    else:
        host, _, port = admin.rpartition(":")
        if not host or not port.isdigit():
            raise AdminError(f"--admin: {admin!r} is not host:port or unix:/path")
        conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=TIMEOUT_S)
    payload = None if body is None else json.dumps(body).encode()
    try:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, payload, headers)
        resp = conn.getresponse()
        data = resp.read()
    except OSError as exc:
        raise AdminError(f"cannot reach the admin API at {admin}: {exc}") from None
    finally:
        conn.close()
    try:
        answer = json.loads(data)
    except json.JSONDecodeError:
        raise AdminError(f"{admin}{path}: HTTP {resp.status}, not JSON: {data[:200]!r}") from None
    if resp.status >= 400:
        message = answer.get("error", {}).get("message", data.decode(errors="replace"))
        raise AdminError(f"{admin}{path}: HTTP {resp.status}: {message}")
    return answer


def table(rows: Sequence[Sequence[object]]) -> str:
    """Aligned columns; the first row is the header."""
    cells = [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in cells)  # fmt: skip


def _num(value: float | None, fmt: str = ".1f") -> str | None:
    return None if value is None else format(value, fmt)


def format_status(s: dict[str, Any]) -> str:
    policy = " ".join(f"{k}={v}" for k, v in s["policy"].items() if k != "name")
    up = int(s["uptime_s"])
    head = [
        f"tokenrouterd pid {s['pid']}: {s['state']}"
        + (f" ({s['reason']})" if s["state"] != "serving" else "")
        + f", model {s['model']}, up {up // 3600}h{up // 60 % 60:02d}m{up % 60:02d}s,"
        f" {s['restarts']} restart(s)",
        f"policy {s['policy']['name']} {policy}".rstrip()
        + f"; active requests {s['active_requests']}/{s['max_inflight']}"
        + f"; handoffs {_num(s['handoffs_per_s']) or '-'}/s"
        + f"; resident {_mib(s.get('memory'))} MiB",
    ]
    rows: list[list[object]] = [["#", "model", "host", "pid", "device", "dtype", "quant",
                                 "weights", "state", "kv used", "kv free", "cached", "hit",
                                 "evicted", "run", "wait", "pend", "tok/s", "handoff/s", "batch",
                                 "rss MiB", "thresholds"]]  # fmt: skip
    for e in s["engines"]:
        weights = e.get("weight_bytes")
        rows.append([
            e["model"], e["name"], e.get("remote") or "local", e["pid"], e["device"], e["dtype"],
            e.get("quantization") or "-", "-" if weights is None else f"{weights / 2**30:.2f}G",
            e["state"],
            e["kv_pages_used"], e["kv_pages_free"], *format_cache(e),
            e["running"], e["waiting"], e["pending"],
            _num(e["tokens_per_s"]), _num(e["handoffs_per_s"]), _num(e["batch_size_mean"]),
            _mib(e.get("memory")), e["thresholds"],
        ])  # fmt: skip
    wait = s["thresholds"]["max_wait_ms"]
    if s.get("share"):
        head.append(format_share(s["share"]))
    dense = [format_crossover(e) for e in s["engines"] if e.get("crossover")]
    dense += [format_draft(e) for e in s["engines"] if e.get("draft")]
    return "\n".join([*head, format_mps(s["mps"]), "", table(rows), *dense,
                      f"max_wait_ms {wait:g}", "", "memory plan:",
                      s["memory_plan_table"]])  # fmt: skip


def format_crossover(e: dict[str, Any]) -> str:
    """A quantised engine's dispatch: per (inputs x bits), the rows from which its linears
    run dense (measured at engine start), "never" when the kernel won at every count."""
    parts = [f"{k}: {'never' if c is None else c}" for k, c in e["crossover"].items()]
    return f"{e['name']}: quantised linears run dense from rows: {', '.join(parts)}"


def format_draft(e: dict[str, Any]) -> str:
    """A speculating engine: its draft model, and how many of its proposals it accepted."""
    proposed, accepted = e.get("proposed") or 0, e.get("accepted") or 0
    rate = f" ({accepted / proposed:.0%})" if proposed else ""
    return (f"{e['name']}: verifies the proposals of {e['draft']}: {accepted} of {proposed} "
            f"accepted{rate}")  # fmt: skip


def _mib(memory: dict[str, Any] | None) -> str:
    """A process's resident size in MiB (trd/engines/memory.py), "-" when not known."""
    rss = (memory or {}).get("rss_bytes")
    return "-" if rss is None else f"{rss / 2**20:,.0f}"


def format_cache(e: dict[str, Any]) -> list[object]:
    """An engine's prefix cache: cached pages, hit rate (tokens matched / asked), evictions."""
    c = e.get("prefix_cache")
    if c is None:
        return ["-" if e["kv_pages_used"] is None else "off", "-", "-"]
    return [c["cached_pages"], f"{c['hit_rate']:.0%}", c["evictions"]]


def format_share(c: dict[str, Any]) -> str:
    """The share control's line: target, measured share, the threshold it holds now."""
    measured = "-" if c["measured"] is None else f"{c['measured']:.1%}"
    tau = "-" if c["threshold"] is None else f"{c['threshold']:.4g}"
    return (f"large-model share: target {c['target']:.1%}, measured {measured} (last "
            f"{c['window_s']:g} s), threshold {tau} ({c['moves']} moves)")  # fmt: skip


def format_mps(m: dict[str, Any]) -> str:
    if m["state"] == "running":
        return f"MPS: running, control daemon pid {m['pid']}, pipe {m['pipe_dir']}"
    return f"MPS: {m['state']} ({m['reason']})"


def from_config(path: str) -> tuple[str, str]:
    """(admin address, admin token) from a daemon config file."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise AdminError(f"--config {path}: cannot read it: {exc}") from None
    if not isinstance(raw, dict):
        raise AdminError(f"--config {path}: not a tokenrouterd config (expected a mapping)")
    return str(raw.get("admin", DEFAULT_ADMIN)), str(raw.get("admin_token", ""))


def format_thresholds(t: dict[str, Any]) -> str:
    rows: list[list[object]] = [["model", "set", "engine reports"]]
    rows += [[name, v["set"], v["engine"]] for name, v in t["models"].items()]
    return f"{table(rows)}\nmax_wait_ms {t['max_wait_ms']:g}"


def format_recommendation(r: dict[str, Any]) -> str:
    rows: list[list[object]] = [
        ["N", "recommended", "predicted tok/s", "current", "predicted tok/s"]
    ]
    for lv in r["levels"]:
        now = lv["current_predicted_tok_s"]
        rows.append([lv["n"], lv["recommended"], f"{lv['predicted_tok_s']:.1f}", lv["current"],
                     "invalid (sum(B-1) >= N)" if now is None else f"{now:.1f}"])  # fmt: skip
    per_model = "  ".join(f"{name}={','.join(map(str, t))}" for name, t in r["models"].items())
    return f"{table(rows)}\nrecommended table: {per_model}  (delta {r['delta_ms']:.3g} ms)"


def parse_settings(items: Sequence[str]) -> dict[str, list[int]]:
    """["small=1", "large=1,2,4"] -> {"small": [1], "large": [1, 2, 4]}."""
    out = {}
    for item in items:
        name, sep, values = item.partition("=")
        try:
            out[name] = [int(v) for v in values.split(",")]
        except ValueError:
            out[name] = []
        if not sep or not name or not out[name] or min(out[name]) < 1:
            raise AdminError(f"--set: {item!r}: expected MODEL=B[,B...] with integers >= 1")
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="trctl", description=__doc__.split("\n\n")[0])
    p.add_argument("--admin", default=os.environ.get("TRCTL_ADMIN", DEFAULT_ADMIN),
                   help="admin API: host:port or unix:/path (default: %(default)s)")  # fmt: skip
    p.add_argument("--token", default=os.environ.get("TRCTL_ADMIN_TOKEN", ""),
                   help="admin token (default: $TRCTL_ADMIN_TOKEN)")  # fmt: skip
    p.add_argument("--config", help="read --admin and --token from the daemon's config file")
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = p.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="engines, memory plan, queues, rates")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    th = sub.add_parser("thresholds", help="show or --set delayed-batching thresholds")
    th.add_argument("--set", nargs="+", metavar="MODEL=B,...", help="e.g. small=1 large=1,2,4")
    th.add_argument("--max-wait-ms", type=float, help="longest wait for a batch to fill")
    th.add_argument(
        "--recommend",
        action="store_true",
        help="the Markov model's best thresholds from live measurements",
    )
    th.add_argument("--apply", action="store_true", help="with --recommend: install them")
    th.add_argument("--json", action="store_true", help="print the raw JSON")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        admin, token = from_config(args.config) if args.config else (args.admin, args.token)

        def call(method: str, path: str, body: Any = None) -> Any:
            return request(admin, method, path, body, token)

        if args.command == "status":
            answer = call("GET", "/status")
            text = format_status(answer)
        elif args.recommend:
            answer = call("GET", "/thresholds/recommend")
            text = format_recommendation(answer)
            if args.apply:
                call("POST", "/thresholds", {"thresholds": answer["models"]})
                text += "\napplied."
        elif args.apply:
            raise AdminError("--apply goes with --recommend")
        elif args.set or args.max_wait_ms is not None:
            body: dict[str, Any] = {"thresholds": parse_settings(args.set or [])}
            if args.max_wait_ms is not None:
                body["max_wait_ms"] = args.max_wait_ms
            answer = call("POST", "/thresholds", body)
            text = format_thresholds(answer)
        else:
            answer = call("GET", "/thresholds")
            text = format_thresholds(answer)
    except AdminError as exc:
        print(f"trctl: {exc}", file=sys.stderr)
        return 1
    try:
        print(json.dumps(answer, indent=2) if args.json else text)
    except BrokenPipeError:  # `trctl status | head`
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python would flush to the closed pipe at exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
