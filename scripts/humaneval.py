#!/usr/bin/env python3
"""HumanEval pass@1 of routed systems served by tokenrouterd (greedy, all 164 problems).

    # each system in a daemon of its own, from two model folders or a two-model config:
    scripts/humaneval.py run --small DIR --large DIR --out runs/heval \
        --systems small,large,rstitch@0.3,rstitch@0.1,glimp@0.3
    # or one system against a daemon already running:
    scripts/humaneval.py run --url http://127.0.0.1:8000 --name mine --out runs/heval
    scripts/humaneval.py score --large DIR --out runs/heval      # NLL under the large model
    scripts/humaneval.py report --out runs/heval --doc-dir docs/quality/humaneval

`run` writes OUT/<system>.json when a system is done (a run cut off keeps the systems
that finished, and a rerun skips them): every problem's completion, its verdict from the
sandbox (hevalkit/sandbox.py: a process per problem with time, memory and network
limits), the tokens each model made, pass@1 and the large share reached. Prompt format
and code extraction: hevalkit/problems.py. `score` adds each completion's mean NLL under
the large model (hevalkit/nll.py); `report` the tables, the paired bootstrap intervals
and the plots (hevalkit/report.py).
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hevalkit import generate, problems, report, sandbox, stats, systems

SAVE_EVERY = 8  # problems scored between two writes of the runs' files

EXEC_WORKERS = 4


def judge(probs: list[problems.Problem], answers: list[generate.Answer]) -> list[dict[str, Any]]:
    """Every answer with its sandbox verdict (a failed request is a failed problem)."""

    def one(pair: tuple[problems.Problem, generate.Answer]) -> dict[str, Any]:
        problem, answer = pair
        row = answer.to_json()
        if answer.error:
            return row | {"passed": False, "verdict": f"request failed: {answer.error}"}
        verdict = sandbox.run_program(problems.program(problem, answer.completion))
        return row | {"passed": verdict.passed, "verdict": verdict.reason}

    with ThreadPoolExecutor(EXEC_WORKERS) as pool:
        return list(pool.map(one, zip(probs, answers, strict=True)))


def run_system(
    name: str,
    url: str,
    probs: list[problems.Problem],
    args: argparse.Namespace,
    extra: dict[str, Any],
) -> dict[str, Any] | None:
    """The system's run, judged; None when a request failed (its answers are kept in the
    sink, the failed ones are asked again by a rerun: never judged as failed problems)."""
    cached = args.out / f"{name}.answers.json"
    if cached.exists():  # generated before, judged again (e.g. after a sandbox change)
        saved = json.loads(cached.read_text())
        answers, seconds = [generate.Answer(**a) for a in saved["answers"]], saved["seconds"]
    else:
        sink = args.out / f"{name}.partial.jsonl"  # resumed from, when a run was cut off
        kept = generate.read_sink(sink)
        todo = [p for p in probs if p.task_id not in kept]
        fresh = generate.generate(
            url, todo, args.max_tokens, args.concurrency, sink=sink, style=args.prompt
        )
        seconds = generate.sink_seconds(sink)  # summed over the runs it was resumed from
        failed = [a for a in fresh if a.error]
        if failed:
            first = failed[0].error
            print(f"{name}: {len(failed)} of {len(fresh)} requests failed (first: {first}); "
                  "not judged, a rerun asks them again", flush=True)  # fmt: skip
            return None
        got = kept | {a.task_id: a for a in fresh}
        answers = [got[p.task_id] for p in probs]
        saved = {"seconds": seconds, "answers": [a.to_json() for a in answers]}
        cached.write_text(json.dumps(saved, indent=1))
    rows = judge(probs, answers)
    tokens = [sum(a.tokens_per_model.values()) for a in answers]
    result = {
        "system": name,
        **extra,
        "problems": len(probs),
        "prompt": args.prompt,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "network": sandbox.network(),
        "generate_s": round(seconds, 1),
        "pass_at_1": stats.pass_at_1([r["passed"] for r in rows]),
        "large_share": generate.large_share(answers, extra["large_model"], extra.get("models")),
        "tokens_mean": sum(tokens) / len(tokens),
        "answers": rows,
    }
    share, mean = result["large_share"], result["tokens_mean"]
    print(f"{name}: pass@1 {result['pass_at_1']:.3f}, large share {share:.3f}, "
          f"{mean:.0f} tokens per completion, {seconds:.0f} s", flush=True)  # fmt: skip
    return result


def cmd_run(args: argparse.Namespace) -> None:
    probs = problems.load_problems(args.limit)[:: args.every]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.url:
        out = args.out / f"{args.name}.json"
        result = run_system(args.name, args.url, probs, args, {"large_model": args.large_model})
        if result is not None:
            out.write_text(json.dumps(result, indent=1))
        return
    base = systems.base_config(args.config, args.small, args.large)
    large_name = base["models"][-1]["name"]
    for system in args.systems.split(","):
        out = args.out / f"{system}.json"
        if out.exists():
            print(f"{system}: {out} exists, skipped", flush=True)
            continue
        cfg = systems.system_config(base, system, args.heads)
        extra = {"large_model": large_name, "policy": cfg["policy"],
                 "models": [m["name"] for m in cfg["models"]]}  # fmt: skip
        if (args.out / f"{system}.answers.json").exists():
            result = run_system(system, "", probs, args, extra)  # judged again only
        else:
            print(f"{system}: starting the daemon", flush=True)
            daemon = systems.start(system, cfg, args.out / "daemons")
            try:
                result = run_system(system, daemon.server.url, probs, args, extra)
                if result is not None and "target_large_share" in cfg["policy"]:
                    result["share_control"] = daemon.admin_get("/status").get("share")
            finally:
                daemon.server.stop()
        if result is not None:
            out.write_text(json.dumps(result, indent=1))


def cmd_score(args: argparse.Namespace) -> None:
    """Each completion's mean NLL under the large model, written into OUT/<system>.json,
    problem by problem (the systems' completions of a problem share its prompt's KV);
    the files are rewritten every SAVE_EVERY problems, so a run cut off keeps its work."""
    from hevalkit.nll import Scorer  # torch and transformers only here

    paths = [p for p in sorted(args.out.glob("*.json")) if not p.name.endswith(".answers.json")]
    runs = {path: json.loads(path.read_text()) for path in paths}
    todo: dict[str, list[tuple[dict[str, Any], str]]] = {}
    for run in runs.values():
        for answer in run["answers"]:
            if "nll" not in answer:
                todo.setdefault(answer["task_id"], []).append((answer, run["prompt"]))
    print(f"{sum(map(len, todo.values()))} completions of {len(todo)} problems to score "
          f"({len(runs)} systems)", flush=True)  # fmt: skip
    if not todo:
        return
    by_id = {p.task_id: p for p in problems.load_problems()}
    scorer = Scorer(args.large, threads=args.threads)
    started = time.perf_counter()
    for done, (task_id, answers) in enumerate(sorted(todo.items()), 1):
        for answer, style in answers:
            answer["nll"] = scorer.nll(by_id[task_id], answer["completion"], style)
        if done % SAVE_EVERY == 0 or done == len(todo):
            for path, run in runs.items():
                path.write_text(json.dumps(run, indent=1))
            print(f"  {done}/{len(todo)} problems scored, {time.perf_counter() - started:.0f} s",
                  flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="generate and judge completions, a JSON per system")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--config", type=Path, help="a tokenrouterd config with two models")
    run.add_argument("--small", type=Path, help="the small model's folder")
    run.add_argument("--large", type=Path, help="the large model's folder")
    run.add_argument("--heads", type=Path, help="router heads (citer/r2r/collm systems)")
    run.add_argument("--systems", default="small,large,rstitch@0.3,rstitch@0.1")
    run.add_argument("--url", help="a running daemon instead (one system, --name)")
    run.add_argument("--name", default="daemon", help="the system's name with --url")
    run.add_argument("--large-model", default="large", help="with --url: the large model")
    run.add_argument("--limit", type=int, help="the first N problems only (a quick check)")
    run.add_argument("--prompt", choices=problems.PROMPT_STYLES, default="body")
    run.add_argument("--every", type=int, default=1, help="every Nth problem only (a spread)")
    run.add_argument("--max-tokens", type=int, default=generate.MAX_TOKENS)
    run.add_argument("--concurrency", type=int, default=generate.CONCURRENCY)
    score = sub.add_parser("score", help="add each completion's NLL under the large model")
    score.add_argument("--out", type=Path, required=True)
    score.add_argument("--large", type=Path, required=True, help="the large model's folder")
    score.add_argument("--threads", type=int, default=1,
                       help="torch threads (1 when a daemon shares the CPU)")  # fmt: skip
    rep = sub.add_parser("report", help="tables, bootstrap intervals and plots")
    rep.add_argument("--out", type=Path, required=True)
    rep.add_argument("--doc-dir", type=Path, required=True)
    args = ap.parse_args()
    if args.cmd == "run":
        cmd_run(args)
    elif args.cmd == "score":
        cmd_score(args)
    else:
        print(report.write(args.out, args.doc_dir))


if __name__ == "__main__":
    main()
