"""`bench compare --plan baseline`: the demo pair beside llama.cpp's server, as a CPU user
would compare them, on the same code prompts through the same client.

    llama_server_large              llama-server, the 1.5B alone (its Q4_K_M GGUF)
    llama_server_small              llama-server, the 0.5B alone
    llama_server_large+draft_small  llama-server, the 1.5B with the 0.5B as draft (-md)
    tokenrouterd_Q                  our daemon with the demo's config (`--demo
                                    --quantization Q`'s policy: DemoPair.policy),
                                    for each Q of the plan (none: bfloat16 weights;
                                    baseline: the demo's int8,int4, int4 and int8)
    tokenrouterd_Q@shareS           the first of those with each request holding S of
                                    its tokens for the large model (`--request-share S`)
    std_large_Q                     standard serving of the 1.5B in our engine: the daemon
                                    with the 1.5B alone, the same settings

Each system in turn (never two at once) is started, warmed up (two requests), measured
at each N (closed loop: `bench serve`'s client on the chat endpoint, the same HumanEval
code prompts, greedy, EOS ignored so every request makes exactly `max_tokens` tokens)
and stopped. llama-server gets --parallel = the largest N and threads = the machine's
cores. Outputs are not compared across systems (llama.cpp computes on the quantised
blocks, ours on the imported weights); within a system, the table says how many answers
at each N are the N=1 answers' text. `baseline_smoke` runs the two daemons on the
fixture pair at a tiny size (no llama-server: the fixtures have no GGUF).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trd.bench import datasets, llamacpp
from trd.bench.result import Result
from trd.bench.serve import add_load_args, measure
from trd.bench.server import Server, daemon_config, serve_config
from trd.demo.pair import ensure_demo_pair, pair_modes

START_TIMEOUT_S = 1200.0  # the demo pair's two engines load 4.5 GB on a busy 2-core host


@dataclass(frozen=True, slots=True)
class BaselinePlan:
    ns: tuple[int, ...]
    prompts: int  # HumanEval code prompts (the dataset's seeded order, the first ones)
    max_tokens: int
    llama: bool  # run the llama-server systems
    routed: tuple[str, ...]  # the quantizations our routed pair runs in
    alone: tuple[str, ...]  # ... and our engine's 1.5B alone
    shares: tuple[float, ...] = ()  # request shares the first routed pair also runs at
    rstitch: bool = False  # ... and R-Stitch for every request (the demo speculates)


BASELINES = {
    # 16 code prompts, 256 tokens: the demo's weights (int8,int4: the 0.5B in int8, the 1.5B
    # in int4), also with each request holding 30% for the 1.5B, both models in int4 and in
    # int8; about an hour on 2 cores (--systems runs
    # some of them) (`tokenrouterd bench step` compares bfloat16, int8 and int4 step by step)
    "baseline": BaselinePlan(
        (1, 16), 16, 256, True, ("int8,int4", "int4", "int8"), ("int4",), (0.3,), True
    ),
    "baseline_smoke": BaselinePlan((1, 2), 2, 8, False, ("none", "int8"), ("none",)),
}
LLAMA = {
    "llama_server_large": ("large", None),
    "llama_server_small": ("small", None),
    "llama_server_large+draft_small": ("large", "small"),
}


def ours(quant: str) -> tuple[str, str]:
    """The names of our routed pair and of our 1.5B alone in `quant` weights (a spec
    SMALL,LARGE names both: tokenrouterd_int8+int4, std_large_int4)."""
    modes = pair_modes(quant)
    return f"tokenrouterd_{quant.replace(',', '+')}", f"std_large_{modes['large']}"


def at_share(quant: str, share: float) -> str:
    """The name of our routed pair in `quant` weights, each request holding `share`."""
    return f"{ours(quant)[0]}@share{share:g}"


def routed_only(quant: str) -> str:
    """The name of our pair in `quant` weights routing every request by R-Stitch (where
    the demo's default is the large model verifying the small one's proposals)."""
    return f"{ours(quant)[0]}@rstitch"


def names_of(plan: BaselinePlan) -> list[str]:
    """The plan's systems, in the order they run."""
    names = [*(LLAMA if plan.llama else ())]
    for quant in dict.fromkeys(plan.routed + plan.alone):
        routed, alone = ours(quant)
        names += [routed] * (quant in plan.routed)
        names += [routed_only(quant)] * (plan.rstitch and (quant,) == plan.routed[:1])
        names += [at_share(quant, s) for s in plan.shares if (quant,) == plan.routed[:1]]
        names += [alone] * (quant in plan.alone)
    return names


class UnknownSystem(ValueError):
    """--systems names a system the plan does not have."""


def pick(plan: BaselinePlan, names: list[str] | None) -> list[str]:
    """The systems named (all without names), in the plan's order; UnknownSystem naming
    any the plan does not have (before anything is imported or started)."""
    known = names_of(plan)
    if names is None:
        return known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UnknownSystem(f"--systems: {', '.join(unknown)} not in this plan; it has "
                         f"{', '.join(known)}")  # fmt: skip
    return [n for n in known if n in names]


def systems(
    plan: BaselinePlan, pair: str, cache_dir: Path | None, names: list[str] | None = None
) -> dict[str, Any]:
    """name -> (its config for the result, a function that starts it in a folder), for the
    systems `names` (all of the plan's without); only their weights are imported."""
    chosen = pick(plan, names)
    daemons = {}
    for quant in dict.fromkeys(plan.routed + plan.alone):
        routed, alone = ours(quant)
        first = (quant,) == plan.routed[:1]
        shared = {at_share(quant, s): s for s in plan.shares if first}
        plain = routed_only(quant) if plan.rstitch and first else None
        if not {routed, alone, plain, *shared} & set(chosen):
            continue
        demo = ensure_demo_pair(pair, cache_dir, quant)
        common: dict[str, Any] = {"dtype": demo.dtype, "kv_tokens": 16384,
                                  "max_model_len": demo.max_model_len}  # fmt: skip
        # The fixtures are quantised at load; the large model drafts with the small one
        # where the demo does (`--speculate`), in the pair's daemons.
        fixtures = pair == "tiny" and quant != "none"
        quantised = {n: {"quantization": demo.modes[n]} if fixtures else {} for n in demo.models}
        drafting = {"large": {"draft": "small"}} if demo.speculate else {}
        per_model = {n: {**quantised[n], **drafting.get(n, {})} for n in demo.models}
        if routed in chosen:
            daemons[routed] = daemon_config(demo.models, demo.policy(), per_model=per_model,
                                            **common)  # fmt: skip
        if plain in chosen:
            policy = replace(demo, speculate=False).policy()
            daemons[plain] = daemon_config(demo.models, policy, per_model=per_model, **common)
        for name, share in shared.items():
            if name in chosen:
                policy = replace(demo, request_share=share).policy()
                daemons[name] = daemon_config(demo.models, policy, per_model=per_model, **common)
        if alone in chosen:
            large = {"large": demo.models["large"]}
            daemons[alone] = daemon_config(large, {"name": "rstitch"}, per_model=quantised,
                                           **common)  # fmt: skip
    out: dict[str, Any] = {}
    for name, (model, draft) in LLAMA.items():
        if name in chosen:
            system = llamacpp.LlamaSystem(model, draft, parallel=max(plan.ns))
            ggufs = llamacpp.demo_ggufs(system, cache_dir)
            out[name] = (system.config(ggufs), _llama(system, cache_dir))
    for name, cfg in daemons.items():
        out[name] = ({"kind": "tokenrouterd", **cfg}, _daemon(name, cfg))
    return out


def _llama(system: llamacpp.LlamaSystem, cache_dir: Path | None) -> Callable[[Path], Server]:
    return lambda folder: llamacpp.start(system, folder, cache_dir).up(START_TIMEOUT_S)


def _daemon(name: str, cfg: dict[str, Any]) -> Callable[[Path], Server]:
    return lambda folder: serve_config(name, cfg, folder, START_TIMEOUT_S)


def load_args(plan: BaselinePlan, n: int, prompts: int) -> argparse.Namespace:
    """The `bench serve` options of one run: its parser's defaults, whatever it gains."""
    p = argparse.ArgumentParser()
    add_load_args(p)
    argv = ["--dataset", "code", "--num-prompts", str(prompts), "--ignore-eos",
            "--max-tokens", str(plan.max_tokens), "--max-concurrency", str(n)]  # fmt: skip
    args = p.parse_args(argv)
    args.model = None  # the one the server lists
    return args


async def run_system(
    name: str, url: str, plan: BaselinePlan, convs: list[datasets.Conversation]
) -> list[dict[str, Any]]:
    await measure(url, load_args(plan, 2, 2), convs[:2], f"{name} warm-up")
    runs = []
    for n in plan.ns:
        run = await measure(url, load_args(plan, n, len(convs)), convs, name)
        runs.append({**run, "n": n})
        s = run["summary"]
        print(f"{name:32} N={n:<3} {cell(s['output_throughput'], '.2f')} tok/s  TTFT p50 "
              f"{cell(s['ttft_ms']['p50'])} ms  failed {s['failed']}", flush=True)  # fmt: skip
    return runs


def run_baseline(
    plan_name: str,
    pair: str,
    out: Path,
    cache_dir: Path | None,
    command: list[str],
    names: list[str] | None = None,
) -> Result:
    """The plan's systems (or those `names`), one after another; the result written to
    `out`."""
    plan = BASELINES[plan_name]
    chosen = systems(plan, pair, cache_dir, names)
    result = Result("bench compare", command)
    result.add(plan_name=plan_name, plan={"ns": list(plan.ns), "prompts": plan.prompts,
                                          "max_tokens": plan.max_tokens, "routed": plan.routed,
                                          "alone": plan.alone, "shares": plan.shares},
                pair=pair)  # fmt: skip
    convs = datasets.load("code", plan.prompts, 0, endpoint="chat")
    logs = out.parent / f"logs-{plan_name}"
    logs.mkdir(parents=True, exist_ok=True)
    for name, (config, start) in chosen.items():
        result.system(name, config)
        server = start(logs)
        try:
            for run in asyncio.run(run_system(name, server.url, plan, convs)):
                result.run(run)
        finally:
            server.stop()
    result.write(out)
    print("\n".join(table(result.body["runs"])))
    return result


def table(runs: list[dict[str, Any]]) -> list[str]:
    """One row per system and N: throughput, latencies (p50), the answers' agreement."""
    first = {r["system"]: {x["prompt"]: x["text"] for x in r["records"]}
             for r in runs if r["n"] == min(x["n"] for x in runs)}  # fmt: skip
    lines = [
        "| system | N | output tok/s | TTFT p50 ms | TPOT p50 ms | E2EL p50 s | large % "
        "| same text as the first N | failed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        s = r["summary"]
        same = sum(first[r["system"]].get(x["prompt"]) == x["text"] for x in r["records"])
        large = "-" if s["large_share"] is None else f"{100 * s['large_share']:.1f}"
        e2el = None if s["e2el_ms"]["p50"] is None else s["e2el_ms"]["p50"] / 1e3
        lines.append(
            f"| {r['system']} | {r['n']} | {cell(s['output_throughput'], '.2f')} "
            f"| {cell(s['ttft_ms']['p50'], '.0f')} | {cell(s['tpot_ms']['p50'])} "
            f"| {cell(e2el)} | {large} | {same}/{s['requests']} | {s['failed']} |"
        )
    return lines


def cell(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)
