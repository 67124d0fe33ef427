"""One measured run of the GPU plan, in the shape every `bench compare` run has.

    {"system", "workload", "share", "n", "max_tokens", ...summary (trd/bench/metrics.py),
     "records": [per request, with diverges_at], "identity": {...} (vs the designed
     tokens), "hbm": {"bound_s", "fraction"}, "predicted": {...} (from the step costs),
     daemons also "ceiling" and "batching" (from their engines' counters)}

Records keep their digests and timings; the inter-token gaps stay in the summary only
(a run of 64 requests x 1,024 tokens would otherwise write 65,536 numbers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trd.bench.compare.ceiling import engine_work
from trd.bench.gpu.bounds import predicted_round_ms, run_bound_s
from trd.bench.gpu.plan import Ctx
from trd.bench.gpu.workload import Designed
from trd.bench.metrics import summarize
from trd.bench.record import Record


def workload_name(share: float | None, max_tokens: int, base: int) -> str:
    name = "alone" if share is None else f"share{round(100 * share)}"
    return name if max_tokens == base else f"{name}@{max_tokens}"


def make_run(
    ctx: Ctx, system: str, share: float | None, n: int, max_tokens: int,
    records: Sequence[Record], wall: float, designed: Designed,
) -> dict[str, Any]:  # fmt: skip
    rows = [{k: v for k, v in r.to_dict().items() if k != "itl_s"} for r in records]
    run: dict[str, Any] = {
        "system": system, "workload": workload_name(share, max_tokens, ctx.plan.max_tokens),
        "share": share, "n": n, "max_tokens": max_tokens, **summarize(records, wall),
        "records": rows,
    }  # fmt: skip
    designed.check(run, records)
    return run


def context(ctx: Ctx, max_tokens: int) -> float:
    """A request's mean context over its output (what each step's attention reads)."""
    return ctx.plan.prompt_tokens + max_tokens / 2


def add_hbm(
    ctx: Ctx, run: dict[str, Any], work: Mapping[str, tuple[int, int]],
    sizes: Mapping[str, Mapping[str, int]] | None,
) -> None:  # fmt: skip
    """The run's HBM bound from the steps it ran (work: model -> (steps, rows))."""
    bw = ctx.read("stepcost").get("bandwidth", {}).get("measured_bytes_s")
    if not bw or not sizes:
        return
    bound = run_bound_s(sizes, work, context(ctx, run["max_tokens"]), bw)
    run["hbm"] = {"bound_s": bound, "fraction": bound / run["duration_s"],
                  "steps": {m: list(w) for m, w in work.items()}}  # fmt: skip


def counted_work(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """(steps, rows) each engine ran between two snapshots of its counters."""
    out = {}
    for name, body in after.items():
        w = engine_work(before.get(name, {}), body)
        out[name] = (w["steps"], w["rows"])
    return out


def add_prediction(ctx: Ctx, run: dict[str, Any], share: float | None) -> None:
    """Throughput the engines' step costs alone predict at this N and share (bounds.py)."""
    costs = ctx.read("stepcost").get("models")
    if not costs or run["max_tokens"] != ctx.plan.max_tokens:
        return  # measured at the plan's context; a longer run reads more KV each step
    round_ms = predicted_round_ms(costs, run["n"], share)
    tok_s = 1e3 * run["n"] / round_ms
    run["predicted"] = {"round_ms": round_ms, "tok_s": tok_s,
                        "fraction": run["output_throughput"] / tok_s}  # fmt: skip
