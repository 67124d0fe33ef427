"""Markdown tables of the report: every run, identity per run, the ceiling, std's profile."""

from __future__ import annotations

from typing import Any

from trd.bench.compare.targets import FULL, Row
from trd.bench.std.phases import PHASES

STD = ("std", "std_nocache")
# The paper's profile of one small-model step of SGLang (radix cache) in standard
# serving, by our phase names (match = its match + lock); insert = "updating the radix
# cache". Shares of the step.
PAPER = {"match": 0.209 + 0.175, "forward": 0.042, "insert": 0.326, "unlock": 0.138}
Run = dict[str, Any]


def shape(r: Run) -> str:
    """The workload's shape: prompt tokens (mean, for chat) -> output tokens."""
    prompt = f"~{r['prompt_tokens_mean']:.0f}" if r["source"] == "chat" else "{:.0f}".format(
        r["prompt_tokens_mean"])  # fmt: skip
    return f"{r['workload']} ({r['source']} {prompt}->{r['max_tokens']})"


def target_table(rows: list[Row]) -> list[str]:
    return ["| ratio | target | measured | verdict | why |", "|---|---|---|---|---|",
            *(r.markdown() for r in rows)]  # fmt: skip


def run_table(runs: list[Run]) -> list[str]:
    lines = [
        "| system | workload | N | req | tok/s (all repeats) | TTFT p50/p90/p99 ms "
        "| TPOT p50/p90/p99 ms | latency p50/p99 s | large % | handoffs/req |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        ttft = "/".join(f"{r['ttft_ms'][f'p{q}']:.0f}" for q in (50, 90, 99))
        tpot = "/".join(f"{r['tpot_ms'][f'p{q}']:.1f}" for q in (50, 90, 99))
        tok_s = f"{r['output_throughput']:.0f}"
        if len(r.get("throughputs", [])) > 1:
            tok_s += " (" + ", ".join(f"{t:.0f}" for t in r["throughputs"]) + ")"
        lines.append(
            f"| {r['system']} | {shape(r)} | {r['n']} | {r['requests']} | {tok_s} | {ttft} "
            f"| {tpot} | {r['e2el_ms']['p50'] / 1e3:.2f}/{r['e2el_ms']['p99'] / 1e3:.2f} "
            f"| {100 * r['large_share']:.0f} | {r['handoffs_per_request']:.1f} |"
        )
    return lines


def daemon_runs(runs: list[Run], key: str) -> list[tuple[Run, dict[str, Any]]]:
    """tokenrouterd's runs that have `key` ("ceiling", "batching"), with its value."""
    return [(r, r[key]) for r in runs if r["system"] == FULL and r.get(key)]


def identity_table(ident: list[dict[str, Any]]) -> list[str]:
    lines = ["| system | workload | N | requests compared | identical | no reference "
             "| first divergence (token) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for i in ident:
        first = "-" if i["first_divergence"] is None else str(i["first_divergence"])
        lines.append(f"| {i['system']} | {i['workload']} | {i['n']} | {i['compared']} "
                     f"| {i['identical']} | {i['no_reference']} | {first} |")  # fmt: skip
    return lines


def ceiling_table(runs: list[Run]) -> list[str]:
    lines = ["| workload | N | tok/s | bound | ceiling tok/s | fraction | per model: steps, "
             "mean batch, ms per row, rows dropped | handoff p50/p99 us |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r, c in daemon_runs(runs, "ceiling"):
        if not c["valid"]:
            lines.append(f"| {r['workload']} | {r['n']} | {r['output_throughput']:.0f} | invalid: "
                         f"{c['invalid']} | - | - | - | - |")  # fmt: skip
            continue
        models = "; ".join(
            f"{name}: {m['steps']}, {m['batch_size_mean']:.1f}, {m['ms_per_row']:.2f}, "
            f"{m['dropped_rows']} ({100 * m['dropped_share']:.0f}%)"
            for name, m in c["models"].items()
        )
        h = c["handoff"]
        lat = f"{h['p50_us']:.0f}/{h['p99_us']:.0f}" if h["sampled"] else "-"
        if h["sampled"] < h["count"]:
            lat += f" (latest {h['sampled']} of {h['count']})"
        lines.append(
            f"| {r['workload']} | {r['n']} | {r['output_throughput']:.0f} | {c['bound']['kind']} "
            f"| {c['ceiling_throughput']:.0f} | {100 * c['fraction']:.0f}% | {models} | {lat} |"
        )
    return lines


def step_cost_table(costs: dict[str, Any]) -> list[str]:
    """Each model's calibrated step costs (`stepcost.py`)."""
    if not costs:
        return ["(no step costs in this run)"]
    sizes = [int(b) for b, _ in next(iter(costs.values()))["decode_ms"]]
    prefill = int(next(iter(costs.values()))["prefill_ms"][0])
    lines = ["| model | context | " + " | ".join(f"decode b={b} ms" for b in sizes)
             + f" | prefill {prefill} ms |", "|---|---|" + "---|" * (len(sizes) + 1)]  # fmt: skip
    for name, c in costs.items():
        cells = " | ".join(f"{ms:.1f}" for _, ms in c["decode_ms"])
        lines.append(f"| {name} | {c['context']} | {cells} | {c['prefill_ms'][1]:.1f} |")
    return lines


def batching_table(runs: list[Run]) -> list[str]:
    lines = ["| workload | N | wall s | per model: steps, rows, tokens fed, needed s "
             "| bound s | fraction | serial: sum s, fraction |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r, b in daemon_runs(runs, "batching"):
        models = "; ".join(f"{name}: {m['steps']}, {m['rows']}, {m['fed']}, {m['need_s']:.1f}"
                           for name, m in b["models"].items())  # fmt: skip
        bound = f"{b['bound_s']:.1f} ({b['kind']})"
        serial = sum(m["need_s"] for m in b["models"].values())
        lines.append(f"| {r['workload']} | {r['n']} | {r['duration_s']:.1f} | {models} "
                     f"| {bound} | {100 * b['fraction']:.0f}% "
                     f"| {serial:.1f}, {100 * serial / r['duration_s']:.0f}% |")  # fmt: skip
    return lines


def profile_table(runs: list[Run]) -> list[str]:
    """Per-phase shares of each standard server's time in its long-output run."""
    found = [r for r in runs if r["system"] in STD and r["workload"].startswith("long")]
    found = [r for r in found if r.get("profile")]
    if not found:
        return ["(no standard-serving profile in this run)"]
    cols = [(r, model) for r in found for model in r["profile"]]
    head = " | ".join(f"{r['system']} {model}" for r, model in cols)
    lines = [
        f"| phase | paper (SGLang, small model) | {head} |",
        "|---|---|" + "---|" * len(cols),
    ]
    for phase in PHASES:
        paper = f"{100 * PAPER[phase]:.1f}%" if phase in PAPER else "-"
        cells = " | ".join(
            f"{100 * r['profile'][m]['shares'][phase]:.1f}% "
            f"({1e3 * r['profile'][m]['seconds'][phase] / max(1, r['profile'][m]['calls']):.2f})"
            for r, m in cols
        )
        lines.append(f"| {phase} | {paper} | {cells} |")
    hits = " | ".join(
        f"{100 * r['profile'][m]['cached_tokens'] / max(1, r['profile'][m]['prompt_tokens']):.0f}%"
        for r, m in cols
    )
    lines.append(f"| prompt tokens served from the cache | - | {hits} |")
    busy = " | ".join(
        f"{100 * sum(r['profile'][m]['seconds'].values()) / r['duration_s']:.0f}%" for r, m in cols
    )
    lines.append(f"| time in the phases / run wall time | - | {busy} |")
    return lines
