"""Greedy completions of the problems from a running daemon, CONCURRENCY at a time, through
the official openai client; each answer with the tokens each model produced.

The served model's id comes from /v1/models. `tokens_per_model` is the daemon's field
beside `usage` (output tokens by producing model); its last entry is the large model (the
models' order in the config). A request that fails is recorded with its error and
counted as a failed problem, never retried silently.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import openai
from openai.types.chat import ChatCompletion

from hevalkit.problems import STOPS, Problem

CONCURRENCY = 16
MAX_TOKENS = 256
TIMEOUT_S = 1800.0


@dataclass
class Answer:
    task_id: str
    completion: str
    finish_reason: str
    tokens_per_model: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""
    # With a sink: the generate() call that made it (its start, epoch seconds), and the
    # seconds from that start to this answer, so a resumed run's wall time is summed.
    run: float = 0.0
    at_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def served_model(api: openai.OpenAI) -> str:
    return api.models.list().data[0].id


def ask(api: openai.OpenAI, model: str, problem: Problem, max_tokens: int, style: str) -> Answer:
    t0 = time.monotonic()
    try:
        resp = api.chat.completions.create(
            model=model,
            messages=problem.messages(style),  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0,
            stop=STOPS,
            extra_body={"continue_final_message": True, "add_generation_prompt": False},
        )
    except openai.OpenAIError as exc:
        return Answer(problem.task_id, "", "error", seconds=time.monotonic() - t0, error=repr(exc))
    return answer_of(problem.task_id, resp, time.monotonic() - t0)


def answer_of(task_id: str, resp: ChatCompletion, seconds: float) -> Answer:
    """The answer in a response, with the daemon's `tokens_per_model` (beside `usage`, not
    inside it: read from inside, every count was missing and every share 0)."""
    choice = resp.choices[0]
    extra = resp.model_extra or {}
    return Answer(
        task_id,
        choice.message.content or "",
        str(choice.finish_reason),
        {str(k): int(v) for k, v in (extra.get("tokens_per_model") or {}).items()},
        seconds,
    )


def generate(
    url: str,
    problems: list[Problem],
    max_tokens: int = MAX_TOKENS,
    concurrency: int = CONCURRENCY,
    progress: bool = True,
    sink: Path | None = None,
    style: str = "body",
) -> list[Answer]:
    """Every problem's answer, in the problems' order; with `sink`, each answer is also
    appended to that JSON-lines file as it comes (a run cut off keeps what finished)."""
    api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)
    model = served_model(api)
    done = 0
    lock = threading.Lock()
    t0, run = time.monotonic(), time.time()

    def one(problem: Problem) -> Answer:
        nonlocal done
        answer = ask(api, model, problem, max_tokens, style)
        answer.run, answer.at_s = run, time.monotonic() - t0
        with lock:
            done += 1
            if sink is not None:
                with sink.open("a") as f:
                    f.write(json.dumps(answer.to_json()) + "\n")
        if progress and (done % 8 == 0 or done == len(problems)):
            print(f"  {done}/{len(problems)} answered, {time.monotonic() - t0:.0f} s", flush=True)
        return answer

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, problems))


def read_sink(sink: Path) -> dict[str, Answer]:
    """The answers a cut-off run appended (failed requests left out: they run again)."""
    if not sink.exists():
        return {}
    rows = [Answer(**json.loads(line)) for line in sink.read_text().splitlines() if line]
    return {a.task_id: a for a in rows if not a.error}


def sink_seconds(sink: Path) -> float:
    """The generating wall time of every run that wrote to the sink, summed: each run's
    time to its last answer (a run cut off counts up to what it finished)."""
    last: dict[float, float] = {}
    for a in read_sink(sink).values():
        last[a.run] = max(last.get(a.run, 0.0), a.at_s)
    return sum(last.values())


def large_share(answers: list[Answer], large: str, models: list[str] | None = None) -> float:
    """The large model's share of all output tokens of the run, from the responses'
    `tokens_per_model`. With `models` (the system's models, in config order) the share is
    checked against what the system can reach: a one-model system's share is 1 or 0 by
    construction, and counts that disagree (or none at all) are an error, not a share."""
    total = sum(sum(a.tokens_per_model.values()) for a in answers)
    if total == 0:
        raise ValueError(f"no tokens_per_model in {len(answers)} answers: no share to report")
    share = sum(a.tokens_per_model.get(large, 0) for a in answers) / total
    if models is not None and len(models) == 1 and share != float(models[0] == large):
        raise ValueError(f"a {models[0]}-only system counted a large ({large}) share of {share}")
    return share
