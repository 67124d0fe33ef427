"""`tokenrouterd eval compare`: HumanEval result files side by side, paired.

    tokenrouterd eval compare routed.json llama-1.5b.json --small small.json \\
        --large large.json [--out-dir DIR]

One row per file (its run's label): the large-token share reached (where the server
returned producers), pass@1 with its Wilson 95% interval, the paired bootstrap 95%
interval of its difference in points against the small model's file (`--small`), the
large model's (`--large`) or, without either, the first file; with both, the share of
the small-to-large gap it recovers; the mean NLL under the large model where
`tokenrouterd eval nll` scored the completions; tokens per completion; generation wall
time. Only the problems every file answered are compared, in the same draws
(`trd/evals/intervals.py`). With --out-dir: the table as tables.md, and pass@1 (and
NLL) against the large share as PNGs, one curve per policy (labels `POLICY@SHARE`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from trd.evals import intervals
from trd.evals.server import percent

Triple = tuple[float, float, float]


def load(path: Path) -> dict[str, Any]:
    """The HumanEval run of a result file, its label made unique by the file's name."""
    body = json.loads(path.read_text())
    if body.get("kind") != "eval humaneval" or len(body.get("runs", [])) != 1:
        raise ValueError(f"{path}: not the result of one `tokenrouterd eval humaneval` run")
    return body["runs"][0] | {"file": path.name}


def _column(run: dict[str, Any], ids: list[str], key: str) -> list[float]:
    by_id = {r["task_id"]: r for r in run["records"]}
    return [math.nan if by_id[i].get(key) is None else float(by_id[i][key]) for i in ids]


def _fmt(triple: Triple | None, scale: float = 100.0) -> str:
    if triple is None:
        return "-"
    v, lo, hi = (x * scale for x in triple)
    return f"{v:+.1f} [{lo:+.1f}, {hi:+.1f}]"


def summarize(runs: list[dict[str, Any]], small: int | None = None,
              large: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """One row per run, on the problems all of them answered; `small` and `large` index
    the runs of the two models alone (None: the first run is the reference)."""
    ids = sorted(set.intersection(*({r["task_id"] for r in run["records"]} for run in runs)))
    if not ids:
        raise ValueError("the files share no problem")
    passed = [_column(run, ids, "passed") for run in runs]
    refs = {"vs_small": small, "vs_large": large} if (small, large) != (None, None) else {
        "vs_first": 0}  # fmt: skip
    rows = []
    for i, run in enumerate(runs):
        nll = [x for x in _column(run, ids, "nll") if not math.isnan(x)]
        tokens = _column(run, ids, "output_tokens")
        k = int(sum(passed[i]))
        row: dict[str, Any] = {
            "system": run["system"], "file": run["file"], "problems": len(ids), "passed": k,
            "large_share": run["summary"]["large_share"],
            "pass_at_1": intervals.pass_at_1([bool(x) for x in passed[i]]),
            "pass_ci": intervals.wilson(k, len(ids)),
            "nll": sum(nll) / len(nll) if len(nll) == len(ids) else None,
            "tokens_mean": sum(tokens) / len(ids), "duration_s": run["summary"]["duration_s"],
        }  # fmt: skip
        for key, ref in refs.items():
            if ref is not None:
                row[key] = intervals.paired_interval(passed[i], passed[ref])
        if small is not None and large is not None:
            row["gap"] = intervals.gap_recovered(passed[i], passed[small], passed[large])
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    refs = [k for k in ("vs_small", "vs_large", "vs_first", "gap") if k in rows[0]]
    names = {"vs_small": "vs small (points)", "vs_large": "vs large (points)",
             "vs_first": "vs first (points)", "gap": "gap recovered (%)"}  # fmt: skip
    head = ["system", "large share", "pass@1 (95% CI)", *(names[k] for k in refs),
            "NLL under large", "tokens per completion", "generation s"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        low, high = r["pass_ci"]
        cells = [r["system"], percent(r["large_share"]),
                 f"{100 * r['pass_at_1']:.1f}% [{100 * low:.1f}, {100 * high:.1f}] "
                 f"({r['passed']}/{r['problems']})",
                 *(_fmt(r.get(k)) for k in refs),
                 "-" if r["nll"] is None else f"{r['nll']:.3f}", f"{r['tokens_mean']:.1f}",
                 f"{r['duration_s']:.0f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], key: str, label: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    placed = [r for r in rows if r["large_share"] is not None and r[key] is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    curves: dict[str, list[tuple[float, float]]] = {}
    for r in placed:
        policy, at, _ = r["system"].partition("@")
        if at:
            curves.setdefault(policy, []).append((100 * r["large_share"], r[key]))
        else:
            ax.plot([100 * r["large_share"]], [r[key]], "*", ms=10, label=r["system"])
    for policy, pts in sorted(curves.items()):
        ax.plot(*zip(*sorted(pts), strict=True), "o-", label=policy)
    ax.set_xlabel("large-model tokens (%, reached)")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tokenrouterd eval compare",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    p.add_argument("files", type=Path, nargs="+", help="`eval humaneval` result files")
    p.add_argument("--small", type=Path, help="the small model alone's result file")
    p.add_argument("--large", type=Path, help="the large model alone's result file")
    p.add_argument("--out-dir", type=Path, help="write tables.md and the plots here")
    args = p.parse_args(argv)
    paths = [*dict.fromkeys([x for x in (args.small, args.large) if x] + args.files)]
    try:
        runs = [load(path) for path in paths]
        small = paths.index(args.small) if args.small else None
        large = paths.index(args.large) if args.large else None
        rows = summarize(runs, small, large)
    except (OSError, ValueError, KeyError) as exc:
        print(f"tokenrouterd eval compare: {exc}", file=sys.stderr)
        return 2
    text = table(rows)
    print(text, end="")
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "tables.md").write_text(text)
        for r in rows:
            r["pass_pct"] = 100 * r["pass_at_1"]
        plot(rows, "pass_pct", "pass@1 (%)", args.out_dir / "humaneval_pass1.png")
        if any(r["nll"] is not None for r in rows):
            plot(rows, "nll", "mean NLL under the large model (nats/token)",
                 args.out_dir / "humaneval_nll.png")  # fmt: skip
    return 0
