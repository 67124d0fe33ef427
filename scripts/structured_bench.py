#!/usr/bin/env python3
"""Structured outputs on a running daemon: validity, large-token share, throughput with and
without constraints, and the time per step spent on grammar masks.

    scripts/structured_bench.py --url http://127.0.0.1:8000 --label rstitch [--n 16]
        [--passes constrained,streamed,unconstrained] [--every 5]

Runs the 50 tasks of `structured_tasks.py` `--n` at a time through the openai client,
three passes: constrained (non-streamed, then streamed: each answer checked with
jsonschema / the regex / the choices / the tools' schemas) and the same chat prompts
unconstrained, each made to write as many tokens as its constrained answer (ignore_eos),
so the throughputs compare the same work. Greedy. Prints one markdown table row per
pass; the mask time comes from the engines' counters on /metrics
(trd_engine_grammar_mask_seconds, trd_engine_busy_seconds, trd_engine_steps).
"""

from __future__ import annotations

import argparse
import re
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from openai import OpenAI, omit
from openai.lib.streaming.chat import ChatCompletionStreamState
from structured_tasks import Task, tasks

MAX_TOKENS = 200


def counters(url: str) -> dict[str, float]:
    """Summed over the engines: steps, busy seconds and mask seconds."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    out: dict[str, float] = dict.fromkeys(("steps", "busy_seconds", "grammar_mask_seconds"), 0.0)
    for name in ("steps", "busy_seconds", "grammar_mask_seconds"):
        for m in re.finditer(rf"^trd_engine_{name}_total\{{[^}}]*\}} (\S+)$", text, re.M):
            out[name] += float(m.group(1))
    return out


def run(client: OpenAI, model: str, task: Task, stream: bool, length: int | None) -> dict[str, Any]:
    """One task: constrained, or (`length` given) unconstrained with exactly that many
    output tokens (tools still in the prompt, with tool_choice none)."""
    kw: dict[str, Any] = {"model": model, "max_tokens": length or MAX_TOKENS, "temperature": 0,
                          "messages": [{"role": "user", "content": task.prompt}]}  # fmt: skip
    extra = dict(task.extra)
    if length is not None:  # the same prompt (tools included), no constraint
        extra = {"tools": extra["tools"], "tool_choice": "none"} if "tools" in extra else {}
    body = {"return_token_ids": True, **extra.pop("extra_body", {})}
    body |= {} if length is None else {"ignore_eos": True}
    if not stream:
        out = client.chat.completions.create(**kw, **extra, extra_body=body)
        c = out.choices[0]
        made = c.model_extra["token_models"] if c.model_extra else []
        return {"content": c.message.content, "calls": c.message.tool_calls or [],
                "finish": c.finish_reason, "models": made}  # fmt: skip
    # The openai client's own accumulation of the deltas (tool-call fragments by index).
    state = ChatCompletionStreamState(input_tools=extra.get("tools", omit))
    models: list[str] = []
    for chunk in client.chat.completions.create(**kw, **extra, extra_body=body, stream=True):
        state.handle_chunk(chunk)
        if chunk.choices:
            models += (chunk.choices[0].model_extra or {}).get("token_models") or []
    final = state.current_completion_snapshot.choices[0]
    return {"content": final.message.content or None, "calls": final.message.tool_calls or [],
            "finish": final.finish_reason, "models": models}  # fmt: skip


def one_pass(
    args: argparse.Namespace, stream: bool, lengths: list[int] | None
) -> tuple[str, list[int]]:
    """A table row, and each task's output length. With `lengths`: unconstrained, each task
    writing as many tokens as its constrained answer had (ignore_eos), so the two passes'
    throughputs compare the same work."""
    client = OpenAI(base_url=f"{args.url}/v1", api_key="unused", timeout=3600)
    model = client.models.list().data[0].id
    work, constrained = tasks()[:: args.every], lengths is None
    caps: list[int | None] = list(lengths) if lengths else [None] * len(work)
    todo = list(zip(work, caps, strict=True))
    before, start = counters(args.url), time.perf_counter()
    with ThreadPoolExecutor(args.n) as pool:
        outs = list(pool.map(lambda tl: run(client, model, tl[0], stream, tl[1]), todo))
    wall, after = time.perf_counter() - start, counters(args.url)
    tokens = sum(len(o["models"]) for o in outs)
    large = sum(m != "small" for o in outs for m in o["models"])
    valid = [t.valid(o["content"], o["calls"]) for t, o in zip(work, outs, strict=True)]
    steps = after["steps"] - before["steps"]
    mask_ms = 1e3 * (after["grammar_mask_seconds"] - before["grammar_mask_seconds"]) / steps
    step_ms = 1e3 * (after["busy_seconds"] - before["busy_seconds"]) / steps
    by_kind = Counter(t.kind for t, ok in zip(work, valid, strict=True) if ok)
    kinds = " ".join(f"{k} {by_kind[k]}/{sum(t.kind == k for t in work)}"
                     for k in ("json", "regex", "choice", "tool"))  # fmt: skip
    shown = f"{sum(valid)}/{len(work)} ({kinds})" if constrained else "-"
    row = (f"| {args.label} | {'yes' if constrained else 'no'} | {'yes' if stream else 'no'} "
            f"| {args.n} | {shown} | {100 * large / max(tokens, 1):.1f}% | {tokens} "
            f"| {tokens / wall:.2f} | {step_ms:.0f} | {mask_ms:.2f} |")  # fmt: skip
    return row, [max(1, len(o["models"])) for o in outs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--label", required=True, help="the policy the daemon runs, for the table")
    ap.add_argument("--n", type=int, default=16, help="requests in flight")
    ap.add_argument("--passes", default="constrained,streamed,unconstrained")
    ap.add_argument("--every", type=int, default=1,
                    help="every k-th task only (5: 10 tasks, 4 JSON and 2 of each other "
                         "kind; for N = 1)")  # fmt: skip
    args = ap.parse_args()
    print(
        "| policy | constrained | streamed | N | valid | large tokens | tokens | tok/s "
        "| step ms | mask ms/step |\n|---|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    lengths: list[int] = []
    for name in args.passes.split(","):
        row, got = one_pass(args, name == "streamed", lengths if name == "unconstrained" else None)
        lengths = lengths or got
        print(row, flush=True)


if __name__ == "__main__":
    main()
