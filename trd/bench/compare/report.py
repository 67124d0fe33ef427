"""`tokenrouterd bench report`: `bench compare`'s JSON as markdown, with matplotlib plots.

    tokenrouterd bench report results/DIR/result.json [--extra results/DIR2/result.json] \\
        [--tiny results/DIR3/result.json] [--out results/DIR/report.md]
    tokenrouterd bench report --headline docs/benchmarks.md

The full report: the main JSON gives it; `--extra` adds further runs of the main pair
under other plans (e.g. `pair_long`, the output lengths), each with its targets,
identity, ceiling and runs; `--tiny` adds the fixture pair's run as a second, quicker
table. It is written beside the main JSON (`report.md`), its plots beside it. Every
sentence that depends on a run is generated from that run's JSON: the machine, the
pair, the plan, the verdicts and their reasons, the notes. Identity is recomputed here
from the runs' digests and the reference table.

The short form (`--headline DOC`): the blocks of DOC that name result files are
rewritten from them, and nothing else in DOC (`headline.py`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from trd.bench.compare import headline
from trd.bench.compare.headline import read, top
from trd.bench.compare.notes import notes
from trd.bench.compare.plots import write_plots
from trd.bench.compare.tables import (
    batching_table,
    ceiling_table,
    identity_table,
    profile_table,
    run_table,
    step_cost_table,
    target_table,
)
from trd.bench.compare.targets import target_rows
from trd.bench.identity import identity

BOUND = [
    "Each engine counts its forwards exactly (steps, request-rows, seconds in forwards, rows",
    "whose candidate token was dropped); F_m is engine m's forward time over the run. With",
    "engines in parallel (each on cores of its own) the run cannot be shorter than the",
    "busiest engine's F_m; on one shared device, than the sum. Ceiling = output tokens / that",
    "bound; fraction = throughput / ceiling, at most 100% when the bound's premise holds.",
    "Rows dropped: R-Stitch drops the small model's candidate when it escalates; those",
    "forwards are in F_m and commit nothing.",
]

BATCHING = [
    "Before any system ran, each model's engine was stepped alone in the benchmark's",
    "process (the daemon's engine code, dtype, linears and threads): the fastest decode",
    "step at each batch size below, and a one-row prefill. A step's linears see one row",
    "per token fed, so a step is priced by the tokens it fed (one per request, or a",
    "request's unseen suffix after a handoff), interpolated between those points. A daemon",
    "run contributes only what it scheduled: the tokens each engine step fed. Needed s =",
    "the sum over its steps of that cost; bound = the busiest engine's (parallel) or the",
    "sum (shared); fraction = bound / wall. None of it comes from the run's own timings",
    "(`trd/bench/compare/stepcost.py`). One request never runs on both engines at once, so",
    "at N=1 the engines take turns and the sum (the serial column) is the bound that",
    "applies there.",
]

SYSTEMS = {  # what each system is (the code), shown for the systems a run has
    "tokenrouterd": "the daemon, OpenAI endpoint, streaming client asking for token ids.",
    "official": "`trd/testing/reference.py` (kv_cache), the research-code way: a Python loop over "
    "transformers models, a `DynamicCache` per model and request, one request at a time, so "
    "it runs at N=1; it serves every prompt and is the identity reference.",
    "std": "`trd/bench/std/server.py` (one single-model server per model, continuous "
    "batching, a vLLM-style prefix cache of full blocks) and `trd/bench/std/dispatcher.py`, "
    "which routes token by token over HTTP sending the full context on every call.",
    "std_nocache": "the same servers with `--no-prefix-cache`: every call re-prefills.",
    "no_delayed_batching": "tokenrouterd with every delayed-batching threshold at 1.",
    "no_pending_kv": "tokenrouterd with `engine.pending_kv: false`.",
    "step_sync": "tokenrouterd with `engine.step_sync: true`.",
    "forced_delay": "tokenrouterd with the large model's threshold forced to 4 at N >= 8.",
}


def setting(data: dict[str, Any]) -> list[str]:
    """What was run, where, and how: all from the JSON."""
    m, plan, pair = data["machine"], data["plan"], data["pair"]
    load = "/".join(f"{x:g}" for x in m["start"]["load"]) if m.get("start") else "not recorded"
    lengths = ", ".join(map(str, plan["lengths"]))
    sweep = f"output lengths {lengths} at N={top(data)}" if lengths else "no output-length sweep"
    gpu = f"GPU {data['gpu']} present, not used" if data.get("gpu") else "no GPU"
    models = "; ".join(
        f"{role} `{d['folder']}` ({d['model_type']}, {d['layers']} layers, hidden {d['hidden']}, "
        f"{d['heads']}/{d['kv_heads']} heads, vocab {d['vocab']})"
        for role, d in pair["models"].items()
    )
    return [
        f"Command: `{' '.join(data['command'])}` ({data['total_s'] / 60:.1f} min). Machine: "
        f"{m['cores']} CPU cores ({m['cpu']}), load average {load} at the start, {gpu}; every "
        f"system ran on the CPU, {data['threads']} torch thread(s) per engine or server. "
        f"Python {m['python']}, torch {data['torch']}, {data['started']}.",
        "",
        f"Pair `{pair['name']}`: {models}. {data['dtype']}, greedy, EOS ignored. Policy: "
        f"R-Stitch, threshold {data['tau']}. Delayed-batching thresholds (Markov model, from "
        f"the live figures of the first run): `{data['thresholds']}`.",
        "",
        f"Plan `{data['plan_name']}`: N = {', '.join(map(str, plan['ns']))}; {sweep}; "
        f"each short-workload daemon "
        f"comparison at N={top(data)} ran {plan['repeats']} time(s), the fastest counting. "
        f"Reference: the official-style loop on every prompt served.",
    ]


def pair_section(data: dict[str, Any], title: str) -> tuple[list[str], list[Any]]:
    runs = data["runs"]
    ident = identity(runs, data["reference"])
    rows = target_rows(runs, ident, top(data), data["pair"]["name"])
    lines = [f"## {title}", "", *setting(data), "", *target_table(rows), ""]
    return lines, rows


def extra_section(data: dict[str, Any], main_n: int) -> list[str]:
    """A further run of the main pair: its own targets, identity, ceiling, runs, notes.

    `main_n`: the main run's largest N, where the targets are set."""
    title = f"Plan `{data['plan_name']}`: pair `{data['pair']['name']}`"
    lines, rows = pair_section(data, title)
    ident = identity(data["runs"], data["reference"])
    n = top(data)
    at_n = [] if n == main_n else [
        f"The targets above are set for the largest N (N={main_n} in the main run); this "
        f"plan's largest N is {n}, so its rows record N={n} against them, not the verdicts "
        f"at N={main_n}.", "",
    ]  # fmt: skip
    return [
        *lines,
        *at_n,
        "Output identity:",
        "",
        *identity_table(ident),
        "",
        f"Forward-only ceiling ({data['bound']['kind']} bound):",
        "",
        *ceiling_table(data["runs"]),
        "",
        "Runs:",
        "",
        *run_table(data["runs"]),
        "",
        "Notes:",
        "",
        *[f"- {note}" for note in notes(data, rows, n)],
        "",
    ]


def render(
    data: dict[str, Any],
    out: Path,
    tiny: dict[str, Any] | None = None,
    extras: list[dict[str, Any]] | None = None,
) -> str:
    runs, n = data["runs"], top(data)
    ident = identity(runs, data["reference"])
    main, rows = pair_section(data, f"Targets: pair `{data['pair']['name']}`")
    lines = [
        "# Benchmarks",
        "",
        "Generated by `tokenrouterd bench report` from runs of `tokenrouterd bench compare`; "
        "do not edit.",
        "",
        *main,
        "## Output identity",
        "",
        "Every request of every run, all repeats, by a digest of its output token ids and the",
        "model that produced each, against the official-style loop's output for the same",
        "prompt and length (the loop's own runs are the reference).",
        "",
        *identity_table(ident),
        "",
        "## Forward-only ceiling",
        "",
        *BOUND,
        f"Bound here: {data['bound']['kind']} ({data['bound']['why']}).",
        "",
        *ceiling_table(runs),
        "",
        "## Batching bound",
        "",
        *BATCHING,
        "",
        *step_cost_table(data.get("step_costs", {})),
        "",
        *batching_table(runs),
        "",
        "## Standard serving: where a server's time goes",
        "",
        "Measured inside each standard server (`GET /profile`) over its long-output run:",
        "share of the phases' summed time and, in brackets, ms per call (forward: summed",
        "over batches). Phases are defined in `trd/bench/std/phases.py`; the paper's",
        "column is its profile of SGLang's step.",
        "",
        *profile_table(runs),
        "",
        "## Plots",
        "",
        *write_plots(runs, n, out.parent),
        "",
        "## All runs",
        "",
        *run_table(runs),
        "",
        "## Notes from this run",
        "",
        *[f"- {note}" for note in notes(data, rows, n)],
        "",
    ]
    for extra in extras or []:
        lines += extra_section(extra, n)
    if tiny is not None:
        second, tiny_rows = pair_section(tiny, f"Second table: pair `{tiny['pair']['name']}`")
        lines += [*second, "Notes:", "",
                  *[f"- {note}" for note in notes(tiny, tiny_rows, top(tiny))], ""]  # fmt: skip
    ran = {r["system"] for d in (data, tiny, *(extras or [])) if d is not None for r in d["runs"]}
    lines += ["## Systems", "", *(f"- **{k}**: {v}" for k, v in SYSTEMS.items() if k in ran)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tokenrouterd bench report", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    ap.add_argument("results", type=Path, nargs="?", help="the main run (the real pair)")
    ap.add_argument("--extra", type=Path, nargs="+", default=[],
                    help="further runs of the main pair (other plans): a section each")  # fmt: skip
    ap.add_argument("--tiny", type=Path, help="the fixture pair's run: a second table")
    ap.add_argument("--out", type=Path, help="the full report (default: report.md beside "
                    "the main run)")  # fmt: skip
    ap.add_argument("--headline", type=Path, metavar="DOC",
                    help="rewrite DOC's result blocks from the files they name (paths from "
                    "the current folder, the checkout's root)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.headline:
        if args.results or args.extra or args.tiny or args.out:
            ap.error("--headline takes no result files: its blocks name them")
        try:
            changed = headline.update(args.headline, Path.cwd())
        except (OSError, ValueError, KeyError) as exc:
            print(f"tokenrouterd bench report: {exc}", file=sys.stderr)
            return 2
        print(f"{'rewrote' if changed else 'unchanged:'} {args.headline}")
        return 0
    if args.results is None:
        ap.error("give the main run's JSON, or --headline DOC")
    out = args.out or args.results.with_name("report.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    tiny = read(args.tiny) if args.tiny else None
    extras = [read(path) for path in args.extra]
    out.write_text(render(read(args.results), out, tiny, extras))
    print(f"wrote {out}")
    return 0
