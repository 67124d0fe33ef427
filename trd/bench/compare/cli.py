"""`tokenrouterd bench compare`: tokenrouterd against the baselines a user would pick
instead, on systems it starts itself -> one result JSON.

Systems, all on the same pair (small + large, float32), the same R-Stitch threshold
and the same greedy requests (EOS ignored):

    tokenrouterd          the daemon, delayed-batching thresholds from its Markov model
    official              research-code loop: HF models, own KV caches, one request at a
                          time; run on every prompt, its outputs are the reference
    std                   one standard server per model + a token-by-token HTTP dispatcher;
                          the servers keep a prefix cache (as vLLM and SGLang do)
    std_nocache           the same, stateless servers: every call re-prefills its context
    no_delayed_batching   tokenrouterd with every threshold at 1
    no_pending_kv         tokenrouterd freeing a request's KV when it leaves an engine
    step_sync             tokenrouterd with a global barrier between engine steps
    forced_delay          tokenrouterd with the large model's threshold forced to 4 at N >= 8

Every request of every system is compared, by its token ids and the model that produced
each, with the official loop's output for the same prompt. Pairs: `--pair demo` (the
real pair, chat prompts; the report's main table) or `--pair tiny` (the fixtures; the
quicker second table). `--plan gpu` measures on a GPU instead (docs/gpu.md: the shaped
pairs at published depth, the transformers baselines, the bounds, issue 53's targets;
with --dry-run the same on the CPU at tiny shapes). A run goes in a folder of its own
under results/ (results/README.md); the real pair's `pair` plan takes about an hour on
2 cores, its `full` plan many hours:

    tokenrouterd bench compare --pair demo --plan pair --out results/DATE-demo/result.json
    tokenrouterd bench compare --pair tiny --out results/DATE-tiny/result.json
    tokenrouterd bench report results/DATE-demo/result.json    # report.md beside it
    tokenrouterd bench report --headline docs/benchmarks.md    # its headline blocks

`--agent` runs only the agent-trajectory workload (`agent.py`: multi-turn
conversations resending all so far; tokenrouterd with its prefix cache on and off,
standard serving, the official loop) and prints its table. On the demo pair on a CPU
the full shape (6 turns of 128 tokens at N = 4, 16) takes hours; a smaller run keeps the
prompts' shape and cuts turns, answers and N:

    tokenrouterd bench compare --pair demo --agent --agent-n 4 --agent-turns 3 \
        --agent-answer 32 --out results/DATE-agent-demo/result.json

`--agent-pace JSON` replays standard serving's send times from such a run (same N, turns
and conversations), so a system is measured at that offered load instead of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import torch

from trd.bench import llamacpp
from trd.bench.compare.agent import scaled_shape
from trd.bench.compare.agent_run import DEFAULT_SYSTEMS, SYSTEMS, AgentBench, read_pace
from trd.bench.compare.agent_table import agent_table
from trd.bench.compare.baseline import BASELINES, UnknownSystem, run_baseline
from trd.bench.compare.pairs import DEFAULT_TAU, PAIRS, load_pair
from trd.bench.compare.plan import PLANS
from trd.bench.compare.runner import Bench
from trd.bench.compare.systems import ENGINE
from trd.bench.gpu.run import run_gpu
from trd.bench.result import Result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tokenrouterd bench compare", description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    ap.add_argument("--plan", choices=sorted([*PLANS, *BASELINES, "gpu"]), default="full",
                    help="baseline: the demo pair beside llama-server (baseline.py); gpu: "
                    "the shaped pairs at published depth on a GPU (trd/bench/gpu/run.py); "
                    "the others: plan.py")  # fmt: skip
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="with --plan gpu: every stage on the CPU at tiny shapes (CI)",
    )
    ap.add_argument("--pair", choices=PAIRS, default="demo")
    ap.add_argument("--systems", metavar="A,B",
                    help="baseline plans: only these of the plan's systems, in its order "
                    "(e.g. llama_server_large,tokenrouterd_int4)")  # fmt: skip
    ap.add_argument("--tau", type=float, help="R-Stitch entropy threshold (default: the pair's)")
    ap.add_argument("--cache-dir", type=Path, help="fixture model cache (default: ~/.cache)")
    ap.add_argument("--out", type=Path, default=Path("results/compare.json"))
    ap.add_argument("--agent", action="store_true", help="only the agent-trajectory workload")
    ap.add_argument(
        "--agent-n", type=int, nargs="+", default=[4, 16], help="agent: conversations in flight"
    )
    ap.add_argument("--agent-turns", type=int, help="agent: turns per conversation (a smaller run)")
    ap.add_argument("--agent-answer", type=int, help="agent: max_tokens of every turn")
    ap.add_argument(
        "--agent-systems",
        default=",".join(DEFAULT_SYSTEMS),
        help="agent: the systems to run, of "
        + ",".join(SYSTEMS)
        + " (the first is the reference the others must equal; default: all but those named "
        "*_wide*, whose forwards may use every core, and tokenrouterd_ahead)",
    )
    ap.add_argument(
        "--agent-per-worker", type=int, default=2,
        help="agent: conversations each of the N workers runs, one after the other",
    )  # fmt: skip
    ap.add_argument(
        "--agent-max-batch-tokens", type=int, default=ENGINE["max_batch_tokens"],
        help="agent: tokens one engine step feeds at most, in every system (daemon and "
             "standard servers alike)",
    )  # fmt: skip
    ap.add_argument(
        "--agent-pace", type=Path, metavar="JSON",
        help="agent: send no turn before standard serving sent it in this earlier agent run "
             "(same N), so each system meets the same offered load, not a closed loop's own",
    )  # fmt: skip
    args = ap.parse_args(argv)
    command = ["tokenrouterd", "bench", "compare", *(sys.argv[3:] if argv is None else argv)]
    if args.dry_run and args.plan != "gpu":
        ap.error(f"--dry-run: only --plan gpu has a dry run, not --plan {args.plan}")
    if args.plan == "gpu":
        return run_gpu("gpu_dry" if args.dry_run else "gpu", args.out, command)
    if args.systems and args.plan not in BASELINES:
        ap.error(f"--systems: only the baseline plans ({', '.join(BASELINES)}) take it")
    if args.plan in BASELINES:
        names = args.systems.split(",") if args.systems else None
        try:
            run_baseline(args.plan, "tiny" if args.pair == "tiny" else "qwen", args.out,
                         args.cache_dir, command, names)  # fmt: skip
        except (llamacpp.LlamaCppError, UnknownSystem) as exc:
            ap.error(str(exc))
        return 0
    systems = args.agent_systems.split(",")
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        ap.error(
            f"--agent-systems: unknown {', '.join(sorted(unknown))}; known: {','.join(SYSTEMS)}"
        )
    try:
        pace = read_pace(args.agent_pace) if args.agent_pace else None
    except ValueError as exc:
        ap.error(str(exc))
    if args.agent_pace and not pace:
        ap.error(f"--agent-pace: {args.agent_pace} holds no standard-serving run with a turn log")
    if args.agent_max_batch_tokens < 1:
        ap.error(f"--agent-max-batch-tokens: {args.agent_max_batch_tokens} is below 1")
    torch.set_num_threads(1)  # the engines under test need the other cores
    result = Result("bench compare", command)
    pair = load_pair(args.pair, args.cache_dir)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    logs = args.out.parent / f"logs-{args.pair}"
    logs.mkdir(exist_ok=True)
    tau = DEFAULT_TAU[args.pair] if args.tau is None else args.tau
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    result.add(torch=torch.__version__, gpu=gpu)  # a GPU present is not used: device cpu
    if args.agent:
        shape = scaled_shape(pair.name, args.agent_turns, args.agent_answer)
        try:
            bench_agent = AgentBench(
                pair,
                tau,
                logs,
                tuple(args.agent_n),
                shape,
                args.agent_per_worker,
                args.agent_max_batch_tokens,
                pace,
            )
        except ValueError as exc:
            ap.error(str(exc))
        agent = asyncio.run(bench_agent.run_all(systems))
        result.add(**agent, systems=bench_agent.systems)
        result.write(args.out)
        print("\n".join(agent_table(agent)))
        return 0
    bench = Bench(PLANS[args.plan], pair, tau, logs)
    data = asyncio.run(bench.run_all())
    result.add(plan_name=args.plan, tau=tau, **data, systems=bench.systems)
    print(f"wrote {result.write(args.out)}")
    return 0
