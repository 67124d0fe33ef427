"""`tokenrouterd eval structured` against a stand-in OpenAI server (no token ids, no
engine counters, no tool calls: every column the daemon's run has, those empty), and the
tasks' checkers on answers written by hand. The run on our daemon:
tests/test_e2e_structured.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from trd.evals.structured import run
from trd.evals.structured.run import main as structured
from trd.evals.structured.tasks import tasks

from test_bench_serve import WORDS, serve_in_thread, stand_in_app


@pytest.fixture(scope="module")
def stand_in() -> Iterator[str]:
    yield from serve_in_thread(stand_in_app())


def test_a_server_without_token_ids_or_counters(stand_in: str, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    argv = ["--base-url", stand_in, "--every", "10", "--passes",
            "constrained,unconstrained", "--out", str(out)]  # fmt: skip
    assert structured(argv) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "eval structured" and "end" in result["machine"]
    constrained, free = result["runs"]
    s = constrained["summary"]
    assert s["valid"] == {"json": "0/2", "regex": "0/1", "choice": "0/1", "tool": "0/1"}
    assert s["large_share"] is s["step_ms"] is s["mask_ms_per_step"] is None
    assert [r["output_tokens"] for r in constrained["records"]] == [WORDS] * 5
    assert all(r["valid"] is None for r in free["records"])


def test_an_unconstrained_pass_needs_a_constrained_one_first(stand_in: str, tmp_path: Path) -> None:
    argv = ["--base-url", stand_in, "--passes", "unconstrained", "--out", str(tmp_path / "s.json")]
    assert structured(argv) == 1


def test_counters_are_read_once_the_engines_last_reports_are_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Engines report every 0.5 s: a pass's last steps reach /metrics after it ended. The
    stand-in's counters still move for three reads; the pass's count is the settled one."""
    reads: list[int] = []

    async def metrics(request: web.Request) -> web.Response:
        reads.append(1)
        steps = 10 * min(len(reads), 4)
        lines = [f'trd_engine_{name}_total{{model="small"}} {steps}' for name in run.COUNTERS]
        return web.Response(text="\n".join(lines) + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    monkeypatch.setattr(run, "SETTLE_S", 0.01)
    for url in serve_in_thread(app):
        assert run.settled(url) == dict.fromkeys(run.COUNTERS, 40.0)
        assert len(reads) == 5  # 10, 20, 30, 40, 40


def test_the_checkers_on_answers_written_by_hand() -> None:
    work = {t.prompt: t for t in tasks()}
    assert len(work) == 50
    person = work["Describe a backend engineer in Berlin as JSON."]
    good = {"name": "Ada", "age": 36, "role": "engineer",
            "address": {"city": "Berlin", "zip": "10115"}}  # fmt: skip
    assert person.valid(json.dumps(good), [])
    assert not person.valid(json.dumps({**good, "age": 121}), [])
    assert not person.valid(json.dumps(good)[:-1], [])  # cut off
    regex = work["A git short hash. Answer with it only."]
    assert regex.valid("1a2b3c4", []) and not regex.valid("1a2b3c4d", [])
    choice = work["Is 17 prime?"]
    assert choice.valid("yes", []) and not choice.valid("Yes", [])
    tool = work["What's the weather in Paris, in celsius?"]
    call = {"name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}
    assert tool.valid(None, [call])
    assert not tool.valid(None, [])  # a tool was required
    assert not tool.valid(None, [{**call, "name": "search_docs"}])  # not offered
    assert not tool.valid(None, [{**call, "arguments": '{"city": "Paris"}'}])
