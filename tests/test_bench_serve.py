"""`tokenrouterd bench serve` against a stand-in OpenAI-compatible server, and its parts.

The stand-in is a few lines of aiohttp (streamed chat and completions, usage in the last
chunk, no token ids, like most servers): the run must measure it with every column our
daemon's run has, the token-model ones empty ("-"), never failing for their absence
(the daemon's run: tests/test_e2e_openai.py). A stand-in whose token ids disagree with
its usage fails those requests. The percentile is checked against values computed by
hand, the datasets for their seeded order, the open loop for its seeded arrivals.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from trd.bench import datasets
from trd.bench.load import arrivals
from trd.bench.serve import main
from trd.bench.stats import percentile, summary

WORDS = 5  # output chunks of the stand-in: one word each
BODIES = web.AppKey("bodies", list[dict[str, Any]])  # every request body, in arrival order


def stand_in_app(lie: bool = False) -> web.Application:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "stand-in"}]})

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        request.app[BODIES].append(body)
        chat = request.path.endswith("/chat/completions")
        n = min(WORDS, body["max_tokens"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            await asyncio.sleep(0.002)
            choice: dict[str, Any] = {"index": 0, "finish_reason": None}
            choice |= {"delta": {"content": f"w{i} "}} if chat else {"text": f"w{i} "}
            if lie:  # ids for every chunk but the first
                choice["token_ids"] = [] if i == 0 else [i]
            await resp.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
            await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode()
                             + b"\n\n")  # fmt: skip
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app[BODIES] = []
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/v1/completions", generate)
    return app


def serve_in_thread(app: web.Application) -> Iterator[str]:
    """The app on a port the OS picks (nothing bound and released first); its URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    host, port = runner.addresses[0][:2]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://{host}:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.fixture(scope="module")
def stand_in() -> Iterator[str]:
    yield from serve_in_thread(stand_in_app())


def run_serve(tmp_path: Path, url: str, *args: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "result.json"
    code = main(["--base-url", url, "--num-prompts", "4", "--max-tokens", "8",
                 "--out", str(out), *args])  # fmt: skip
    return code, json.loads(out.read_text())


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_server_without_token_ids_gets_every_column_the_token_model_ones_empty(
    stand_in: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], endpoint: str
) -> None:
    code, result = run_serve(tmp_path, stand_in, "--endpoint", endpoint, "--max-concurrency", "2")
    assert code == 0
    run = result["runs"][0]
    s = run["summary"]
    assert (s["requests"], s["failed"], s["output_tokens"]) == (4, 0, 4 * WORDS)
    assert s["prompt_tokens"] == 4 * 7 and run["settings"]["model"] == "stand-in"
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        assert all(v is not None and v > 0 for v in s[key].values()), (key, s[key])
    assert s["ttft_ms"]["p50"] < s["e2el_ms"]["p50"]
    for key in ("large_share", "tokens_per_model", "handoffs_per_request", "identity"):
        assert s[key] is None
    rec = run["records"][0]
    assert len(rec["itl_s"]) == WORDS - 1 and rec["output"] is None and rec["producers"] is None
    assert rec["counted_by"] == "usage" and rec["error"] is None
    table = capsys.readouterr().out
    rows = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in table.splitlines())}
    assert rows["Large-token share"] == rows["Identity digest"] == "-"
    assert rows["Handoffs per request"] == "-" and rows["Output tokens"] == str(4 * WORDS)
    # The result schema: the command, the machine's load at start and end, the system.
    assert result["schema"] == "tokenrouterd-result/1" and result["kind"] == "bench serve"
    assert result["command"][:3] == ["tokenrouterd", "bench", "serve"]
    assert {"start", "end", "cores", "cpu"} <= set(result["machine"])
    assert len(result["machine"]["end"]["load"]) == 3
    assert result["systems"] == {stand_in: {"base_url": stand_in, "model": "stand-in"}}


def test_token_ids_that_disagree_with_the_usage_fail_the_request(tmp_path: Path) -> None:
    for url in serve_in_thread(stand_in_app(lie=True)):
        code, result = run_serve(tmp_path, url)
        s = result["runs"][0]["summary"]
        assert code == 1 and s["failed"] == 4
        assert s["first_error"] == f"{WORDS - 1} token ids returned, usage says {WORDS} tokens"


def test_an_open_loop_sends_at_seeded_poisson_arrivals(stand_in: str, tmp_path: Path) -> None:
    code, result = run_serve(tmp_path, stand_in, "--request-rate", "20", "--seed", "3")
    assert code == 0
    sent = [r["sent_s"] for r in result["runs"][0]["records"]]
    want = arrivals(4, 20.0, 3)
    assert want == arrivals(4, 20.0, 3) != arrivals(4, 20.0, 4) and want[0] == 0.0
    assert all(w <= s < w + 0.5 for s, w in zip(sent, want, strict=True)), (sent, want)
    assert arrivals(3, float("inf"), 3) == [0.0, 0.0, 0.0]


def test_a_conversation_resends_everything_with_the_servers_answers(tmp_path: Path) -> None:
    app = stand_in_app()
    path = tmp_path / "conv.jsonl"
    path.write_text('{"system": "be brief", "turns": ["first", "second"]}\n')
    for url in serve_in_thread(app):
        code, result = run_serve(tmp_path, url, "--dataset", f"jsonl:{path}", "--num-prompts", "1")
        assert code == 0
    answer = "".join(f"w{i} " for i in range(WORDS))
    assert [b["messages"] for b in app[BODIES]] == [
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "first"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "first"},
         {"role": "assistant", "content": answer}, {"role": "user", "content": "second"}],
    ]  # fmt: skip
    assert [(r["conversation"], r["turn"]) for r in result["runs"][0]["records"]] == [
        (0, 0),
        (0, 1),
    ]


def test_extra_body_fields_reach_every_request_and_the_result(tmp_path: Path) -> None:
    """`--extra-body`: a server's own fields (tokenrouterd's routing and priority) merged
    into each body last, and kept in the result's settings."""
    app = stand_in_app()
    extra = {"routing": {"large_share": 0.2}, "priority": 1, "max_tokens": 3}
    for url in serve_in_thread(app):
        code, result = run_serve(tmp_path, url, "--extra-body", json.dumps(extra))
        assert code == 0
    assert len(app[BODIES]) == 4
    assert all({k: b[k] for k in extra} == extra for b in app[BODIES])  # over --max-tokens 8
    assert result["runs"][0]["settings"]["extra_body"] == extra


def test_percentile_interpolates_linearly_between_ranks() -> None:
    assert percentile([1, 2, 3, 4], 50) == 2.5  # rank 1.5
    assert percentile([4, 1, 3, 2], 0) == 1 and percentile([4, 1, 3, 2], 100) == 4
    assert percentile(range(1, 101), 99) == pytest.approx(99.01)  # rank 98.01
    assert percentile([10, 20, 30], 90) == pytest.approx(28.0)  # rank 1.8: 20 + 0.8 * 10
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"q must be in 0\.\.100, got 101"):
        percentile([1], 101)
    assert summary([0.001, 0.003], 1e3) == {"mean": 2.0, "p50": 2.0, "p90": 2.8, "p99": 2.98}
    assert summary([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_datasets_come_in_the_seeds_order_and_refuse_what_they_lack(tmp_path: Path) -> None:
    chat = datasets.load("chat", 32, seed=1)
    assert datasets.load("chat", 5, seed=1) == chat[:5] != datasets.load("chat", 5, seed=2)
    with pytest.raises(ValueError, match="the chat dataset has 32 prompts, 33 asked"):
        datasets.load("chat", 33)
    code = datasets.load("code", 16, endpoint="completions")
    assert {c.turns[0] for c in code} <= set(datasets.humaneval_prompts())
    asked = datasets.load("code", 16, endpoint="chat")
    assert all(
        str(a.turns[0]).endswith(f"{c.turns[0]}```") for a, c in zip(asked, code, strict=True)
    )
    rand = datasets.load("random", 3, seed=0, input_len=40)
    assert all(len(str(c.turns[0]).split()) == 40 for c in rand)
    agent = datasets.load("agent", 2, agent=datasets.AgentShape(turns=3, system_len=50, tool_len=9))
    assert agent[0].system == agent[1].system and len(str(agent[0].system).split()) == 50
    assert [len(str(t).split()) for c in agent for t in c.turns] == [9] * 6
    assert len({t for c in agent for t in c.turns}) == 6
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello"}\n\n{"system": "be brief", "turns": ["a", "b"]}\n')
    got = sorted(datasets.load(f"jsonl:{path}", 2), key=lambda c: len(c.turns))
    assert got == [datasets.Conversation(("hello",)), datasets.Conversation(("a", "b"), "be brief")]
    path.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(ValueError, match=r"jsonl:.*p.jsonl: line 1: expected"):
        datasets.load(f"jsonl:{path}", 1)
    with pytest.raises(ValueError, match="'sharegpt' is not one of chat, code, random"):
        datasets.load("sharegpt", 1)


def test_bad_options_are_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    for args, msg in ((["--max-concurrency", "0"], "--max-concurrency: must be at least 1, got 0"),
                      (["--request-rate", "0"], "--request-rate: must be above 0, got 0.0"),
                      (["--dataset", "nope"], "--dataset: 'nope' is not one of"),
                      (["--extra-body", "[1]"], "--extra-body: expected a JSON object"),
                      (["--extra-body", "{"], "--extra-body: not JSON")):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            main(["--base-url", "http://127.0.0.1:9", *args])
        assert exc.value.code == 2 and msg in capsys.readouterr().err
