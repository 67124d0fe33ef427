"""`bench compare` results written before the one schema, read as the schema's.

The runs of 2026-12-03..05 in `results/` (`scripts/bench.py`, the command's former
home) name a few things differently: a run's `throughput`, `large_fraction`,
`ttft_p50` ... in seconds; a record's `ttft`, `latency`, `tpot`; the command as one
string; the machine with its `date` and no load average (those runs did not record it).
`upgrade` returns such a file's content with the schema's names, every value as measured
(seconds become the schema's milliseconds); a file in the schema comes back unchanged.
"""

from __future__ import annotations

import shlex
from typing import Any

RUN_KEYS = {"throughput": "output_throughput", "large_fraction": "large_share",
            "wall_s": "duration_s"}  # fmt: skip
SUMMARIES = {"ttft": "ttft_ms", "tpot": "tpot_ms", "latency": "e2el_ms"}
RECORD_KEYS = {"ttft": "ttft_s", "latency": "latency_s", "tpot": "tpot_s"}
QUANTILES = (50, 90, 99)


def _run(run: dict[str, Any]) -> dict[str, Any]:
    out = {RUN_KEYS.get(k, k): v for k, v in run.items()
           if not any(k.startswith(f"{s}_p") for s in SUMMARIES)}  # fmt: skip
    for old, new in SUMMARIES.items():
        out[new] = {"mean": None, **{f"p{q}": 1e3 * run[f"{old}_p{q}"] for q in QUANTILES}}
    out["records"] = [_record(rec) for rec in run["records"]]
    out["other_repeats"] = [[_record(rec) for rec in rep] for rep in run.get("other_repeats", [])]
    return out


def _record(rec: dict[str, Any]) -> dict[str, Any]:
    return {RECORD_KEYS.get(k, k): v for k, v in rec.items()}


def reproduce(data: dict[str, Any]) -> list[str]:
    """The command that makes this result today: the recorded one, or for a file of
    `python scripts/bench.py ARGS`, `tokenrouterd bench compare ARGS` (same options)."""
    cmd = list(data["command"])
    if "scripts/bench.py" in cmd:
        cmd = ["tokenrouterd", "bench", "compare", *cmd[cmd.index("scripts/bench.py") + 1 :]]
    return cmd


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the schema's names (unchanged when it is in the schema already)."""
    if "schema" in data:
        return data
    m = data["machine"]
    return {
        **data, "command": shlex.split(data["command"]), "started": m["date"], "torch": m["torch"],
        "gpu": m["gpu"], "machine": {"cores": m["cores"], "cpu": m["cpu"],
                                     "python": m["python"], "start": None},
        "runs": [_run(r) for r in data["runs"]],
    }  # fmt: skip
