"""Issue 53's targets, computed by the GPU plan from its own measurements (met / missed /
not comparable, each with its reason; trd/bench/compare/targets.py `Row`).

    tokenrouterd N=16, 10% large / the transformers loop, 10% large     >= 10x
    single-user speed at N=16 / at N=1 (1 / TPOT p50)                   >= 50%
    the large model alone through our engine, N=1: HBM bound / TPOT     >= 70%
    routed TPOT at N=1 / the step costs' prediction for its share       <= 1.2x
    every request of every system identical to the designed tokens     all
    every policy: graphs on = graphs off, token for token               all

A ratio of two runs counts only when both wrote the designed tokens and their large
shares differ by at most SHARE_SLACK (the loop serves fewer prompts than the daemon at
N=16; its speed per token does not depend on which, all prompts having one length).
"""

from __future__ import annotations

from typing import Any

from trd.bench.compare.stepcost import step_ms
from trd.bench.compare.targets import SHARE_SLACK, Row, find
from trd.bench.gpu.bounds import step_bound_s
from trd.bench.gpu.plan import GpuPlan
from trd.bench.gpu.workload import Designed

Run = dict[str, Any]


def _missing(name: str, target: str, what: str) -> Row:
    return Row(name, target, "not run", "not comparable", f"no {what} run")


def _not_designed(*runs: Run) -> str | None:
    for r in runs:
        if not Designed.identical(r):
            i = r.get("identity") or {}
            return (f"{r['system']} {r['workload']} N={r['n']}: {i.get('identical')} of "
                    f"{i.get('compared')} requests as designed")  # fmt: skip
    return None


def _row(name: str, target: str, shown: str, ok: bool, why: str, *runs: Run) -> Row:
    if (bad := _not_designed(*runs)) is not None:
        return Row(name, target, shown, "missed", bad)
    return Row(name, target, shown, "met" if ok else "missed", why)


def rows(plan: GpuPlan, runs: list[Run], step: dict[str, Any], policies: list[Any]) -> list[Row]:
    share = plan.daemons[0][2]
    w, top = f"share{round(100 * share)}", 16 if 16 in plan.ns else max(plan.ns)
    out = []
    a, b = find(runs, "tokenrouterd", w, top), find(runs, "official", w)
    name = f"tokenrouterd N={top} / official loop, {w}"
    if a is None or b is None:
        out.append(_missing(name, ">= 10x", "tokenrouterd or official"))
    else:
        x = a["output_throughput"] / b["output_throughput"]
        gap = abs((a["large_share"] or 0) - (b["large_share"] or 0))
        shares = f"large {100 * a['large_share']:.1f}% vs {100 * b['large_share']:.1f}%"
        row = _row(name, ">= 10x", f"{x:.1f}x", x >= 10, shares, a, b)
        out.append(Row(name, row.target, row.measured, "not comparable", shares)
                   if gap > SHARE_SLACK and row.verdict != "missed" else row)  # fmt: skip
    one, many = find(runs, "tokenrouterd", w, 1), find(runs, "tokenrouterd", w, top)
    name = f"single-user speed N={top} / N=1, {w}"
    if one is None or many is None or not many["tpot_ms"]["p50"]:
        out.append(_missing(name, ">= 50%", "tokenrouterd N=1 and N=top"))
    else:
        v = one["tpot_ms"]["p50"] / many["tpot_ms"]["p50"]
        why = f"TPOT p50 {one['tpot_ms']['p50']:.2f} vs {many['tpot_ms']['p50']:.2f} ms"
        out.append(_row(name, ">= 50%", f"{100 * v:.0f}%", v >= 0.5, why, one, many))
    out.append(_hbm_row(plan, runs, step))
    out.append(_overhead_row(runs, step, w))
    out.append(_identity_row(runs))
    out.append(_policies_row(plan, policies))
    return out


def _hbm_row(plan: GpuPlan, runs: list[Run], step: dict[str, Any]) -> Row:
    name, target = "large model alone, our engine, N=1: HBM bound / TPOT", ">= 70%"
    run, large = find(runs, "large_alone", "alone", 1), step.get("models", {}).get("large")
    bw = step.get("bandwidth", {}).get("measured_bytes_s")
    if run is None or large is None or not bw or not run["tpot_ms"]["mean"]:
        return _missing(name, target, "large_alone N=1 or step-cost")
    bound_ms = 1e3 * step_bound_s(large, 1, plan.prompt_tokens + plan.max_tokens / 2, bw)
    v = bound_ms / run["tpot_ms"]["mean"]
    why = (f"bound {bound_ms:.2f} ms ({large['weights_read'] / 1e9:.2f} GB at the measured "
           f"{bw / 1e12:.2f} TB/s) vs TPOT {run['tpot_ms']['mean']:.2f} ms")  # fmt: skip
    return _row(name, target, f"{100 * v:.0f}%", v >= 0.7, why, run)


def _overhead_row(runs: list[Run], step: dict[str, Any], w: str) -> Row:
    name, target = f"routed TPOT N=1 / step-cost prediction, {w}", "<= 1.2x"
    run, costs = find(runs, "tokenrouterd", w, 1), step.get("models")
    if run is None or not costs or run["large_share"] is None or not run["tpot_ms"]["mean"]:
        return _missing(name, target, "tokenrouterd N=1 or step-cost")
    s = run["large_share"]
    small, large = step_ms(costs["small"]["decode_ms"], 1), step_ms(costs["large"]["decode_ms"], 1)
    pred = (1 - s) * small + s * large
    v = run["tpot_ms"]["mean"] / pred
    why = (f"TPOT {run['tpot_ms']['mean']:.3f} ms vs {1 - s:.3f} x {small:.3f} + {s:.3f} x "
           f"{large:.3f} = {pred:.3f} ms")  # fmt: skip
    return _row(name, target, f"{v:.2f}x", v <= 1.2, why, run)


def _identity_row(runs: list[Run]) -> Row:
    ident = [r["identity"] for r in runs if r.get("identity")]
    same = sum(i["identical"] for i in ident)
    total = sum(i["compared"] + i["no_reference"] for i in ident)
    bad = [f"{r['system']} {r['workload']} N={r['n']}" for r in runs if not Designed.identical(r)]
    shown = f"{same}/{total} requests in {len(ident)} runs"
    why = "token ids and the model of each, vs the designed tokens" if not bad else (
        "differ: " + ", ".join(bad))  # fmt: skip
    return Row(
        "every request as designed, every system",
        "all",
        shown,
        "met" if total and not bad else "missed",
        why,
    )


def _policies_row(plan: GpuPlan, policies: list[Any]) -> Row:
    name = "each policy: graphs on = off, as designed"
    if not policies:
        return _missing(name, "all", "policies")
    bad = [p["policy"] for p in policies if not (p["equal"] and p["as_designed"])]
    idle = [p["policy"] for p in policies if not 0 < p["large_share"] < 1]
    shown = f"{len(policies) - len(bad)}/{len(plan.policies)}"
    why = ("differ: " + ", ".join(bad)) if bad else (
        f"routed nothing or everything: {', '.join(idle)}" if idle else
        "tokens and models, large share " + ", ".join(
            f"{p['policy']} {100 * p['large_share']:.0f}%" for p in policies))  # fmt: skip
    ok = not bad and not idle and len(policies) == len(plan.policies)
    return Row(name, "all", shown, "met" if ok else "missed", why)
