"""The report's plots, each of what was measured only (no point is extrapolated)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from trd.bench.compare.targets import FULL

LADDER = ("no_delayed_batching", "no_pending_kv", "step_sync", "forced_delay", FULL)
Run = dict[str, Any]


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def series_vs_n(runs: list[Run]) -> dict[str, list[tuple[int, float]]]:
    """(N, tok/s) of each system's short-workload runs: only the N it ran at."""
    out: dict[str, list[tuple[int, float]]] = {}
    for system in (FULL, "std", "std_nocache", "official"):
        pts = sorted((r["n"], r["output_throughput"]) for r in runs
                     if r["system"] == system and r["workload"] == "short")  # fmt: skip
        if pts:
            out[system] = pts
    return out


def plot_vs_n(runs: list[Run], path: Path) -> None:
    """Throughput vs N, short workload; a system run at one N (official) is one point."""
    fig, ax = plt.subplots(figsize=(6, 4))
    ns = sorted({r["n"] for r in runs if r["workload"] == "short"})
    for system, pts in series_vs_n(runs).items():
        ax.plot(*zip(*pts, strict=True), "s" if len(pts) == 1 else "o-", label=system)
    ax.set(xscale="log", yscale="log", xlabel="concurrent requests N", ylabel="output tokens/s",
           title="Throughput vs N (short workload)")  # fmt: skip
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    ax.legend()
    _save(fig, path)


def plot_efficiency_vs_length(runs: list[Run], path: Path) -> None:
    """tokenrouterd's fraction of its forward-only ceiling per output length, each point
    labelled with its large-token share (lengths compare like for like only at one share)."""
    pts = sorted((r["max_tokens"], r["ceiling"]["fraction"], r["large_share"]) for r in runs
                 if r["system"] == FULL and r["workload"].startswith("long")
                 and r.get("ceiling", {}).get("valid"))  # fmt: skip
    fig, ax = plt.subplots(figsize=(6, 4))
    if pts:
        xs, ys, _ = zip(*pts, strict=True)
        ax.plot(xs, [100 * y for y in ys], "o-", label=FULL)
        for x, y, share in pts:
            ax.annotate(f"large {100 * share:.0f}%", (x, 100 * y), textcoords="offset points",
                        xytext=(0, 6), ha="center", fontsize=8)  # fmt: skip
        ax.set_xticks(list(xs), [str(x) for x in xs])
    ax.set(xscale="log", xlabel="max output tokens", ylabel="% of the forward-only ceiling",
           ylim=(0, 110), title="Efficiency vs output length (N = largest)")  # fmt: skip
    ax.minorticks_off()
    _save(fig, path)


def plot_ladder(runs: list[Run], top_n: int, path: Path) -> None:
    vals = {r["system"]: r["output_throughput"] for r in runs
            if r["workload"] == "short" and r["n"] == top_n and r["system"] in LADDER}  # fmt: skip
    names = [s for s in LADDER if s in vals]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.barh(names, [vals[s] for s in names], color=["#bbb"] * (len(names) - 1) + ["#2a6"])
    ax.set(xlabel="output tokens/s", title=f"Ablations (short workload, N = {top_n})")
    _save(fig, path)


PLOTS = {
    "bench_throughput_vs_n.png": ("throughput vs N", plot_vs_n),
    "bench_efficiency_vs_length.png": ("efficiency vs output length", plot_efficiency_vs_length),
}


def write_plots(runs: list[Run], top_n: int, folder: Path) -> list[str]:
    """Write every plot into `folder`; the markdown lines that show them."""
    for name, (_, plot) in PLOTS.items():
        plot(runs, folder / name)
    plot_ladder(runs, top_n, folder / "bench_ablations.png")
    shown = [(title, name) for name, (title, _) in PLOTS.items()]
    shown.append(("ablation ladder", "bench_ablations.png"))
    return [f"![{title}]({name})" for title, name in shown]
