"""The report's target rows, judged like for like, each with its reason taken from the run.

The like-for-like rule: a ratio of two runs counts only when both served the same
prompts (the same prompt set) and the large model made the same share of their output
tokens, within `SHARE_SLACK`; otherwise the row is "not comparable" and says which
differs. A run with any request whose output differs from the reference, or that has no
reference, fails every row it is in ("missed", with the count). Lengths are compared by
efficiency (throughput / forward-only ceiling), not raw throughput: a longer context
costs each forward more whatever the serving system does.

    tokenrouterd / official, short, largest N                  >= 10x (the real pair: 6x)
    tokenrouterd / official, short, N=1, the same prompts      >= 1x
    tokenrouterd / std, std output length, largest N          >= 5x   (std_nocache shown)
    efficiency at the longest / the shortest output length    >= 90%
    throughput / forward-only ceiling, short, largest N       >= 70%
    throughput / batching bound, short, largest N             >= 85%  (`stepcost.py`)
    median handoff latency, short, largest N                  <= 100 us
    ablation / tokenrouterd, short, largest N                 < 1.00x
    every request identical to the reference                  all
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from trd.bench.identity import differing
from trd.bench.metrics import digest_set

FULL = "tokenrouterd"
ABLATIONS = ("no_delayed_batching", "no_pending_kv", "step_sync")
SHARE_SLACK = 0.02  # largest difference of large-token share between compared runs
# tokenrouterd at the largest N / the official loop, by pair: the real pair's is issue #29's.
OFFICIAL_X = {"demo": 6.0, "tiny": 10.0}
Run = dict[str, Any]


@dataclass(frozen=True)
class Row:
    name: str
    target: str
    measured: str
    verdict: str  # "met" | "missed" | "not comparable"
    why: str

    def markdown(self) -> str:
        return f"| {self.name} | {self.target} | {self.measured} | {self.verdict} | {self.why} |"


def find(runs: list[Run], system: str, workload: str, n: int | None = None) -> Run | None:
    return next((r for r in runs if r["system"] == system and r["workload"] == workload
                 and (n is None or r["n"] == n)), None)  # fmt: skip


def spec(wanted: str) -> tuple[str, str, int | None]:
    """ "tokenrouterd short N=16" -> ("tokenrouterd", "short", 16); no N: any."""
    system, workload, *n = wanted.split()
    return system, workload, int(n[0].removeprefix("N=")) if n else None


def label(run: Run) -> str:
    return f"{run['system']} {run['workload']} N={run['n']}"


def unlike(a: Run, b: Run) -> str | None:
    """Why runs `a` and `b` are not like for like, or None when they are."""
    if a["prompt_set"] != b["prompt_set"]:
        return f"different prompts ({a['requests']} vs {b['requests']} requests, other sets)"
    gap = abs(a["large_share"] - b["large_share"])
    if gap > SHARE_SLACK:
        return (f"large-token share {100 * a['large_share']:.0f}% ({label(a)}) vs "
                f"{100 * b['large_share']:.0f}% ({label(b)})")  # fmt: skip
    return None


def failed(ident: list[dict[str, Any]], *runs: Run) -> str | None:
    """The identity failure of any of `runs` (reference runs are the reference)."""
    for run in runs:
        bad = None if run.get("reference") else differing(ident, run)
        if bad is not None:
            first = bad["first_divergence"]
            where = "" if first is None else f", first at token {first}"
            lacks = f", {bad['no_reference']} without a reference" if bad["no_reference"] else ""
            return (f"{label(run)}: {bad['compared'] - bad['identical']} of {bad['compared']} "
                    f"requests differ from the reference{where}{lacks}")  # fmt: skip
    return None


def verdict(ok: bool, why_met: str, why_missed: str) -> tuple[str, str]:
    return ("met", why_met) if ok else ("missed", why_missed)


def repeats_note(a: Run, b: Run) -> str:
    ka, kb = len(a.get("throughputs", [1])), len(b.get("throughputs", [1]))
    return "" if ka == kb else f" (best of {ka} vs {kb} run{'s' if kb > 1 else ''})"


def ratio_row(
    name: str, target: str, runs: list[Run], want: tuple[str, str],
    meets: Callable[[float], bool], ident: list[Any], extra: str = "",
) -> Row:  # fmt: skip
    """Throughput of run `want[0]` / run `want[1]` ("system workload N=n"; "official
    short": any N), judged by `meets`, like for like."""
    a, b = (find(runs, *spec(w)) for w in want)
    if a is None or b is None:
        return Row(name, target, "not run", "not comparable", f"no {want[a is not None]} run")
    return compare(name, target, a, b, meets, ident, extra)


def official_on(runs: list[Run], run: Run) -> Run | None:
    """The official loop's figures on exactly `run`'s prompts. It serves one request at a
    time, so its throughput on a subset is the subset's tokens over their latencies."""
    ref = find(runs, "official", run["workload"])
    want = {r["prompt"] for r in run["records"]}
    recs = [r for r in ref["records"] if r["prompt"] in want] if ref else []
    if ref is None or len(recs) != len(want):
        return None
    tokens = sum(r["output_tokens"] for r in recs)
    large = sum(r["tokens_per_model"].get("large", 0) for r in recs)
    return {**ref, "requests": len(recs), "prompt_set": digest_set(want), "records": recs,
            "output_throughput": tokens / sum(r["latency_s"] for r in recs),
            "large_share": large / max(1, tokens)}  # fmt: skip


def single_user_row(runs: list[Run], ident: list[Any]) -> Row:
    name, target = "tokenrouterd N=1 / official, the same prompts", ">= 1.00x"
    one = find(runs, FULL, "short", 1)
    ref = official_on(runs, one) if one else None
    if one is None or ref is None:
        return Row(name, target, "not run", "not comparable", "no N=1 run or its prompts unserved")
    return compare(name, target, one, ref, lambda v: v >= 1, ident)


def compare(
    name: str, target: str, a: Run, b: Run, meets: Callable[[float], bool],
    ident: list[Any], extra: str = "",
) -> Row:  # fmt: skip
    value = a["output_throughput"] / b["output_throughput"]
    shown = f"{value:.2f}x{repeats_note(a, b)}{extra}"
    if (bad := failed(ident, a, b)) is not None:
        return Row(name, target, shown, "missed", bad)
    if (why := unlike(a, b)) is not None:
        return Row(name, target, shown, "not comparable", why)
    share = f"same {a['requests']} prompts, large share {100 * a['large_share']:.0f}%"
    return Row(name, target, shown, *verdict(meets(value), share, share))


def length_row(runs: list[Run], top_n: int, ident: list[Any]) -> Row:
    longs = sorted((r for r in runs if r["system"] == FULL and r["workload"].startswith("long")),
                   key=lambda r: r["max_tokens"])  # fmt: skip
    if len(longs) < 2:
        return Row("efficiency vs output length", ">= 90%", "not run", "not comparable",
                   "fewer than two output lengths in the plan")  # fmt: skip
    short, long = longs[0], longs[-1]
    name = f"efficiency at {long['max_tokens']} / at {short['max_tokens']} tokens, N={top_n}"
    effs = [r["ceiling"]["fraction"] if r.get("ceiling", {}).get("valid") else None
            for r in (long, short)]  # fmt: skip
    if effs[0] is None or effs[1] is None:
        return Row(name, ">= 90%", "no ceiling", "not comparable", "a run has no valid ceiling")
    value = effs[0] / effs[1]
    shown = f"{100 * value:.0f}% ({100 * effs[0]:.0f}% vs {100 * effs[1]:.0f}% of the bound)"
    if (bad := failed(ident, long, short)) is not None:
        return Row(name, ">= 90%", shown, "missed", bad)
    if (why := unlike(long, short)) is not None:
        return Row(name, ">= 90%", shown, "not comparable", why)
    share = f"same prompts, large share {100 * long['large_share']:.0f}%"
    return Row(name, ">= 90%", shown, *verdict(value >= 0.9, share, share))


def ceiling_row(run: Run | None, ident: list[Any]) -> Row:
    name, target = "throughput / forward-only ceiling", ">= 70%"
    c = run.get("ceiling") if run else None
    if run is None or c is None:
        return Row(name, target, "not run", "not comparable", "no daemon run at the largest N")
    name = f"{name}, {label(run)}"
    if not c["valid"]:
        return Row(name, target, "invalid", "not comparable", c["invalid"])
    frac, bound = c["fraction"], c["bound"]
    shown = f"{100 * frac:.0f}% ({bound['kind']} bound)"
    above = f"throughput above the {bound['kind']} bound: its premise ({bound['why']}) failed"
    return fraction_row(Row(name, target, shown, "", bound["why"]), run, frac, 0.7, above, ident)


def fraction_row(
    row: Row, run: Run, frac: float, want: float, above: str, ident: list[Any]
) -> Row:  # fmt: skip
    """`row` (name, target, shown, why; no verdict yet) judged: not comparable above 1,
    missed on a changed output, else met when `frac` >= `want`."""
    if frac > 1.0:
        return replace(row, verdict="not comparable", why=above)
    if (bad := failed(ident, run)) is not None:
        return replace(row, verdict="missed", why=bad)
    return replace(row, verdict="met" if frac >= want else "missed")


def batching_row(run: Run | None, ident: list[Any]) -> Row:
    name, target = "throughput / batching bound", ">= 85%"
    b = run.get("batching") if run else None
    if run is None or b is None:
        return Row(name, target, "not run", "not comparable", "no daemon run with step costs")
    name = f"{name}, {label(run)}"
    frac = b["fraction"]
    shown = f"{100 * frac:.0f}% ({b['kind']}: {b['bound_s']:.1f} s of {run['duration_s']:.1f} s)"
    above = "faster than the calibrated costs of its batches: the calibration ran slow"
    why = "step costs measured alone before the runs, at the batch sizes this run had"
    return fraction_row(Row(name, target, shown, "", why), run, frac, 0.85, above, ident)


def handoff_row(run: Run | None) -> Row:
    name, target = "median handoff latency", "<= 100 us"
    h = run.get("ceiling", {}).get("handoff") if run else None
    if run is None or h is None:
        return Row(name, target, "not run", "not comparable", "no daemon run at the largest N")
    name = f"{name}, {label(run)}"
    if not h["sampled"]:
        return Row(name, target, "-", "not comparable", "no handoffs in the run")
    seen = (
        f"{h['sampled']} handoffs"
        if h["sampled"] == h["count"]
        else f"the latest {h['sampled']} of {h['count']} handoffs (engines keep {h['window']})"
    )
    shown = f"{h['p50_us']:.0f} us (p99 {h['p99_us']:.0f})"
    return Row(name, target, shown, *verdict(h["p50_us"] <= 100, seen, seen))


def identity_row(ident: list[dict[str, Any]]) -> Row:
    same = sum(i["identical"] for i in ident)
    total = sum(i["compared"] + i["no_reference"] for i in ident)
    bad = [f"{i['system']} {i['workload']} N={i['n']}" for i in ident
           if i["identical"] < i["compared"] or i["no_reference"]]  # fmt: skip
    shown = f"{same}/{total} requests in {len(ident)} runs"
    why = "token ids and producing models, vs the official loop" if not bad else (
        "differ: " + ", ".join(bad))  # fmt: skip
    return Row("every request identical to the reference", "all", shown,
               "met" if not bad and total else "missed", why)  # fmt: skip


def target_rows(runs: list[Run], ident: list[dict[str, Any]], top_n: int, pair: str) -> list[Row]:
    full, top = find(runs, FULL, "short", top_n), f"short N={top_n}"
    std = next(
        (r for r in runs if r["system"] == "std" and r["workload"].startswith("long")),
        find(runs, "std", "short", top_n),
    )  # a plan without long runs: the short one
    wl = f"{std['workload'] if std else 'long'} N={top_n}"
    extra = ""
    if (a := find(runs, *spec(f"{FULL} {wl}"))) and (b := find(runs, *spec(f"std_nocache {wl}"))):
        extra = f"; vs std_nocache {a['output_throughput'] / b['output_throughput']:.2f}x"
    x = OFFICIAL_X[pair]
    std_row = (
        ratio_row(f"tokenrouterd / std, {std['max_tokens']} tokens, N={top_n}", ">= 5x", runs,
                  (f"{FULL} {wl}", f"std {wl}"), lambda v: v >= 5, ident, extra)
        if std else Row(f"tokenrouterd / std, N={top_n}", ">= 5x", "not run", "not comparable",
                        "the plan runs no standard serving")
    )  # fmt: skip
    rows = [
        ratio_row(f"tokenrouterd N={top_n} / official", f">= {x:g}x", runs,
                  (f"{FULL} {top}", "official short"), lambda v: v >= x, ident),
        single_user_row(runs, ident),
        std_row,
        length_row(runs, top_n, ident),
        ceiling_row(full, ident),
        batching_row(full, ident),
        handoff_row(full),
    ]  # fmt: skip
    for name in ABLATIONS:
        want = (f"{name} {top}", f"{FULL} {top}")
        row = ratio_row(f"{name} / tokenrouterd, N={top_n}", "< 1.00x", runs, want,
                        lambda v: v < 1, ident)  # fmt: skip
        rows.append(row)
    rows.append(identity_row(ident))
    return rows
