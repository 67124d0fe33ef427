"""Plots (one per measure, every policy on it) and the equal-share table of a sweep."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

Run = dict[str, Any]
MEASURES = {
    "identical": "responses identical to large-only greedy",
    "nll": "mean NLL per token under the large model (nats)",
    "handoffs_per_req": "handoffs per request",
    "tok_s": "throughput at N=16 (tokens/s)",
}
REFERENCES = ("large-only", "small-only")


def curves(points: list[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for p in points:
        if p["policy"] not in REFERENCES:
            out.setdefault(p["policy"], []).append(p)
    return {k: sorted(v, key=lambda p: p["large_share"]) for k, v in out.items()}


def plot(points: list[Run], folder: Path, title: str) -> list[Path]:
    paths = []
    for key, label in MEASURES.items():
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for name, pts in curves(points).items():
            style = "--" if name.startswith("random") else "-"
            ax.plot([p["large_share"] for p in pts], [p[key] for p in pts], style, marker="o",
                    label=name)  # fmt: skip
        for p in points:
            if p["policy"] in REFERENCES:
                ax.plot(p["large_share"], p[key], "k*" if p["policy"] == "large-only" else "kX",
                        markersize=11, label=p["policy"])  # fmt: skip
        ax.set_xlabel("large-model share of tokens")
        ax.set_ylabel(label)
        ax.set_title(f"{title}: {label}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = folder / f"quality_{key}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def at_share(pts: list[Run], key: str, share: float) -> float | None:
    """The measure interpolated at `share`, inside the measured range only."""
    xs = [p["large_share"] for p in pts]
    if not pts or not min(xs) <= share <= max(xs):
        return None
    return float(np.interp(share, xs, [p[key] for p in pts]))


def offline_table(offline: dict[str, float]) -> str:
    lines = ["| score | share escalated for 95% recall of mismatches |", "|---|---|"]
    lines += [f"| {name} | {share:.3f} |" for name, share in offline.items()]
    return "\n".join(lines)


def table(points: list[Run], shares: list[float]) -> str:
    """Markdown: identical fraction and NLL of every curve at equal large-token shares."""
    cs = curves(points)
    head = "| policy | " + " | ".join(f"{s:.0%}: identical / NLL" for s in shares) + " |"
    lines = [head, "|---" * (len(shares) + 1) + "|"]
    for name, pts in cs.items():
        cells = []
        for s in shares:
            ident, nll = at_share(pts, "identical", s), at_share(pts, "nll", s)
            cells.append("-" if ident is None or nll is None else f"{ident:.2f} / {nll:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
