"""The report's notes, each written only when the run shows what it says.

A note states measured figures of this run and nothing it did not measure: no claim
about other hardware, no fixed sentence. Every function returns [] when its condition
does not hold or its figures are missing.
"""

from __future__ import annotations

from typing import Any

from trd.bench.compare.targets import FULL, Row, find

Run = dict[str, Any]


def batching_gain(runs: list[Run], top_n: int, rows: list[Row]) -> list[str]:
    """When the official target is not met: what batching cut per request-row here."""
    if not any(r.name.endswith("/ official") and r.verdict != "met" for r in rows):
        return []
    one, top = find(runs, FULL, "short", 1), find(runs, FULL, "short", top_n)
    if not (one and top and one.get("ceiling") and top.get("ceiling")):
        return []
    parts = []
    for name, a in one["ceiling"]["models"].items():
        b = top["ceiling"]["models"].get(name)
        if b and a["ms_per_row"] and b["ms_per_row"]:
            parts.append(
                f"{name} {a['ms_per_row']:.1f} ms at batch {a['batch_size_mean']:.1f} (N=1) vs "
                f"{b['ms_per_row']:.1f} ms at batch {b['batch_size_mean']:.1f} (N={top_n}), "
                f"{a['ms_per_row'] / b['ms_per_row']:.1f}x"
            )
    if not parts:
        return []
    return [f"The official-style target was not met. Forward cost per request-row in this "
            f"run: {'; '.join(parts)}. That factor is what batching saved per token on each "
            f"engine."]  # fmt: skip


def delayed_batching(runs: list[Run], top_n: int, thresholds: dict[str, Any]) -> list[str]:
    """Why the no-delayed-batching ablation was not slower, when it was not."""
    a, b = find(runs, "no_delayed_batching", "short", top_n), find(runs, FULL, "short", top_n)
    if not (a and b) or a["output_throughput"] < b["output_throughput"]:
        return []
    return [f"Delayed batching did not pay in this run: no_delayed_batching ran "
            f"{a['output_throughput'] / b['output_throughput']:.2f}x tokenrouterd's throughput "
            f"at N={top_n} "
            f"with the Markov model's thresholds `{thresholds}`."]  # fmt: skip


def step_costs(runs: list[Run]) -> list[str]:
    """How much dearer the large model's forward was than the small one's, at N=1."""
    one = find(runs, FULL, "short", 1)
    models = one["ceiling"]["models"] if one and one.get("ceiling") else {}
    small, large = models.get("small"), models.get("large")
    if not (small and large and small["step_ms_mean"]):
        return []
    cost = large["step_ms_mean"] / small["step_ms_mean"]
    return [f"At N=1 a large-model step took {large['step_ms_mean']:.1f} ms and a small-model "
            f"step {small['step_ms_mean']:.1f} ms ({cost:.1f}x): routing a token to the small "
            f"model saves at most that factor."]  # fmt: skip


def repeat_spread(runs: list[Run]) -> list[str]:
    """How far repeated runs of one configuration differed: the noise floor of this host."""
    spreads = [(max(t) / min(t) - 1, r) for r in runs if len(t := r.get("throughputs", [])) > 1]
    if not spreads:
        return []
    worst, run = max(spreads, key=lambda s: s[0])
    return [f"{len(spreads)} configurations ran {len(run['throughputs'])} times each and the "
            f"fastest run counts; repeats differed by up to {100 * worst:.0f}% "
            f"({run['system']} {run['workload']} N={run['n']}): gaps smaller than that are "
            f"not evidence."]  # fmt: skip


def dropped_rows(runs: list[Run], top_n: int) -> list[str]:
    """The forward rows that committed nothing (R-Stitch's dropped candidates)."""
    top = find(runs, FULL, "short", top_n)
    models = top["ceiling"]["models"] if top and top.get("ceiling") else {}
    parts = [f"{name} {m['dropped_rows']} of {m['rows']} ({100 * m['dropped_share']:.0f}%)"
             for name, m in models.items() if m["dropped_rows"]]  # fmt: skip
    if not parts:
        return []
    return [f"Forward rows whose candidate token was dropped (they cost a forward and commit "
            f"nothing), N={top_n}: {'; '.join(parts)}."]  # fmt: skip


def notes(data: dict[str, Any], rows: list[Row], top_n: int) -> list[str]:
    runs = data["runs"]
    return [
        *data.get("notes", []),
        *batching_gain(runs, top_n, rows),
        *delayed_batching(runs, top_n, data.get("thresholds", {})),
        *step_costs(runs),
        *dropped_rows(runs, top_n),
        *repeat_spread(runs),
    ]
