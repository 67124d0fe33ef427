"""The GPU plan's result, rebuilt from every stage's JSON after each stage ends: the
result file (trd/bench/result.py's schema), OUT/summary.txt (its first line: the stages'
verdict so far) and OUT/table.md (the tables docs/gpu.md takes from a run).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trd.bench.compare.targets import Row
from trd.bench.gpu.plan import Ctx
from trd.bench.gpu.targets import rows
from trd.bench.result import Result
from trd.bench.stages import verdict

RUN_HEADER = ("| system | workload | N | output tok/s | TPOT p50 ms | TTFT p50 ms | large % "
              "| as designed | HBM bound | step-cost prediction |\n"
              "|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip


def collect(ctx: Ctx, stages: dict[str, Any]) -> dict[str, Any]:
    """Everything the stages measured so far, in the result's keys."""
    runs = [r for name in stages for r in ctx.read(name).get("runs", [])]
    systems: dict[str, Any] = {}
    for name in stages:  # a daemon system's config per stage (its MPS setting and share)
        data = ctx.read(name)
        if "config" in data:
            entry = systems.setdefault(data["system"], {"kind": "tokenrouterd", "stages": {}})
            entry["stages"][name] = data["config"]
    hf = ctx.read("hf")
    if "official_config" in hf:
        systems["official"] = hf["official_config"]
    if "generate_config" in hf:
        systems["hf_generate"] = {"kind": "transformers generate", **hf["generate_config"]}
    if any(r["system"] == "large_alone" for r in runs):
        systems["large_alone"] = {"kind": "tokenrouterd, each request routing.model: large",
                                  "daemon": ctx.plan.daemons[0][0]}  # fmt: skip
    step = ctx.read("stepcost")
    return {
        "plan_name": "gpu_dry" if ctx.plan.dry_run else "gpu", "plan": dataclasses.asdict(ctx.plan),
        "versions": {k: v for k, v in ctx.read("versions").items() if k not in ("ok",)},
        "checkpoints": ctx.read("checkpoints").get("models"), "kernels": ctx.read("kernels"),
        "bandwidth": step.get("bandwidth"), "step_costs": step.get("models"), "runs": runs,
        "identity": [r["identity"] for r in runs if "identity" in r], "systems": systems,
        "policies": ctx.read("policies").get("policies", []),
        "stages": {k: {x: v.get(x) for x in ("ok", "seconds", "error")}
                   for k, v in stages.items() if isinstance(v, dict)},  # not "status"
    }  # fmt: skip


def cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def run_lines(runs: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in runs:
        i, hbm, pred = r.get("identity", {}), r.get("hbm", {}), r.get("predicted", {})
        large = None if r["large_share"] is None else 100 * r["large_share"]
        lines.append(
            f"| {r['system']} | {r['workload']} | {r['n']} | {cell(r['output_throughput'], '.1f')} "
            f"| {cell(r['tpot_ms']['p50'], '.3f')} | {cell(r['ttft_ms']['p50'], '.1f')} "
            f"| {cell(large, '.1f')} | {i.get('identical', '-')}/{i.get('compared', '-')} "
            f"| {cell(100 * hbm['fraction'] if hbm else None, '.0f')}% "
            f"| {cell(100 * pred['fraction'] if pred else None, '.0f')}% |"
        )
    return lines


def tables(body: dict[str, Any], targets: list[Row]) -> str:
    v = body["versions"]
    what = (f"{v.get('device', 'cpu (dry run)')}, driver {v.get('driver')}, torch "
            f"{v.get('torch')}, flashinfer {v.get('flashinfer')}, transformers "
            f"{v.get('transformers')}")  # fmt: skip
    bw = body.get("bandwidth") or {}
    out = [f"Ran on: {what}."]
    if bw:
        spec = bw.get("spec_bytes_s")
        out.append(f"HBM bandwidth for the bounds: {bw['measured_bytes_s'] / 1e12:.2f} TB/s "
                   f"measured (a {bw['copy_mib']} MiB device copy); datasheet "
                   f"{cell(spec / 1e12 if spec else None, '.2f')} TB/s.")  # fmt: skip
    out += ["", RUN_HEADER, *run_lines(body["runs"]), "",
            "| target | wanted | measured | verdict | why |", "|---|---|---|---|---|",
            *(t.markdown() for t in targets)]  # fmt: skip
    if body["policies"]:
        out += ["", "| policy | graphs on = off | as designed | large % | handoffs | first "
                "difference |", "|---|---|---|---|---|---|"]  # fmt: skip
        out += [f"| {p['policy']} | {p['equal']} | {p['as_designed']} | "
                f"{100 * p['large_share']:.1f} | {p['handoffs']} | {p['mismatch'] or '-'} |"
                for p in body["policies"]]  # fmt: skip
    return "\n".join(out) + "\n"


def write(ctx: Ctx, result: Result, path: Path, stages: dict[str, Any], order: list[str]) -> str:
    """Rewrite the result, the table and the summary from what has run; the summary."""
    body = collect(ctx, stages)
    targets = rows(ctx.plan, body["runs"], ctx.read("stepcost"), body["policies"])
    result.add(**{k: v for k, v in body.items() if k != "systems"},
               targets=[dataclasses.asdict(t) for t in targets])  # fmt: skip
    for name, cfg in body["systems"].items():
        result.system(name, cfg)
    result.write(path)
    text = tables(body, targets)
    (ctx.out / "table.md").write_text(text)
    status = stages.get("status") or verdict(stages, order)
    lines = [
        status,
        f"GPU benchmark{' (dry run, CPU: numbers mean nothing)' if ctx.plan.dry_run else ''}",
    ]
    lines += [
        f"{'PASS' if s.get('ok') else 'FAIL'} {k} ({s.get('seconds', '?')} s) "
        f"{s.get('error', '')}".rstrip()
        for k, s in stages.items()
        if isinstance(s, dict)
    ]
    summary = "\n".join(lines) + "\n\n" + text
    (ctx.out / "summary.txt").write_text(summary)
    return summary
