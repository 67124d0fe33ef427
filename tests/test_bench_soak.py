"""`tokenrouterd bench serve --duration` (the long-load mode) without a daemon: the mix,
the growth it judges, and a short run against a stand-in server.

The stand-in answers as an OpenAI-compatible server does: streamed or one JSON answer as
the body asks, a 400 for a bad field. The daemon's run, with its memory sampled through
the admin API, is in tests/test_e2e_structured.py (per commit) and test_e2e_memory.py (slow).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from trd.bench.mix import BAD_FIELDS, GRAMMARS, MAX_TOKENS, SoakMix
from trd.bench.samples import growth, left_behind
from trd.bench.serve import main
from trd.bench.soak import parse_duration

from test_bench_serve import serve_in_thread

WORDS = 6  # output chunks of the stand-in


def stand_in() -> web.Application:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "stand-in"}]})

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bad = [k for k, v in BAD_FIELDS if body.get(k) == v]
        if bad:
            return web.json_response({"error": {"message": f"bad {bad[0]}"}}, status=400)
        chat = request.path.endswith("/chat/completions")
        n = min(WORDS, body["max_tokens"])
        usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
        if not body["stream"]:
            choice = {"message": {"content": "w " * n}} if chat else {"text": "w " * n}
            return web.json_response({"choices": [choice], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        choice = {"delta": {"content": "w "}} if chat else {"text": "w "}
        chunks = [*([{"choices": [choice]}] * n), {"choices": [], "usage": usage}]
        try:
            for chunk in chunks:
                await asyncio.sleep(0.002)
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionResetError:  # a stream the client cut
            pass
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/v1/completions", generate)
    return app


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    yield from serve_in_thread(stand_in())


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900),
                                               ("2h", 7200), ("0.5m", 30)])  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "ten", "0", "-5m", "5d"])
def test_bad_durations_name_the_value(text: str) -> None:
    with pytest.raises(ValueError, match=repr(text)):
        parse_duration(text)


def test_the_mix_is_a_function_of_its_seed_in_the_shares_it_promises() -> None:
    mix = SoakMix("m", seed=3, grammars=0.2, token_ids=True)
    assert [mix.request(i) for i in range(50)] == [SoakMix("m", 3, 0.2, True).request(i)
                                                   for i in range(50)]  # fmt: skip
    assert mix.request(0) != SoakMix("m", 4, 0.2, True).request(0)
    shapes = [mix.request(i) for i in range(4000)]
    share = Counter[str]()
    for s in shapes:
        b = s.body
        good = {k: v for k, v in b.items() if k != s.bad}
        assert 1 <= good.get("max_tokens", 1) <= MAX_TOKENS
        assert 0 <= good.get("temperature", 0) <= 1
        assert b["return_token_ids"] is True and ("messages" in b) == (s.endpoint == "chat")
        if s.cut_after is not None:
            assert b["stream"] and s.bad is None and s.cut_after <= max(1, b["max_tokens"] // 2)
        assert s.bad is None or dict(BAD_FIELDS)[s.bad] == b[s.bad]
        so = b.get("structured_outputs")
        assert so is None or so in GRAMMARS or s.bad == "structured_outputs"
        shared = mix.system in (b.get("prompt") or b["messages"][0]["content"])
        share.update(stream=b["stream"], cut=s.cut_after is not None, bad=s.bad is not None,
                     grammar=so in GRAMMARS, chat=s.endpoint == "chat", shared=shared)  # fmt: skip
    want = {"stream": 0.5, "cut": 0.135, "bad": 0.1, "grammar": 0.2, "chat": 0.5, "shared": 0.5}
    for key, p in want.items():
        assert abs(share[key] / len(shapes) - p) < 0.03, (key, share[key] / len(shapes))


def sample(t: float, rss: dict[str, int], **extra: Any) -> dict[str, Any]:
    procs = {n: {"rss_bytes": v, "requests": 0, "kv_pages_used": 0} for n, v in rss.items()}
    return {"t_s": t, "requests_done": 0, "active_requests": 0, "processes": procs, **extra}


def test_growth_is_the_slope_after_the_warmup_in_percent() -> None:
    # Warm-up from 1000 to 1500, then flat for "a" and +1 a second for "b".
    samples = [sample(0, {"a": 1000, "b": 1000}), sample(60, {"a": 1500, "b": 1500})]
    samples += [sample(t, {"a": 1500, "b": 1500 + (t - 120)}) for t in (120, 180, 240, 300)]
    g = growth(samples, warmup_s=120)
    assert g["a"] == {"from_s": 120, "to_s": 300, "first": 1500, "last": 1500,
                      "slope_per_h": 0.0, "growth_pct": 0.0}  # fmt: skip
    assert g["b"]["slope_per_h"] == pytest.approx(3600)
    assert g["b"]["growth_pct"] == pytest.approx(100 * 180 / 1500)
    assert growth(samples, warmup_s=200) == {}  # two samples after it: nothing to judge


def test_left_behind_names_what_the_last_sample_holds() -> None:
    assert left_behind([]) == {}
    idle = sample(9, {"supervisor": 1, "small": 1})
    assert left_behind([idle]) == {}
    idle["processes"]["small"] |= {"requests": 2, "kv_pages_used": 5}
    assert left_behind([{**idle, "active_requests": 1}]) == {
        "in flight": 1, "small requests": 2, "small kv pages": 5,
    }  # fmt: skip


def test_a_short_run_sends_the_mix_cuts_streams_and_counts_refusals(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "soak.json"
    argv = ["--base-url", url, "--duration", "3s", "--max-concurrency", "4", "--seed", "7",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    run = json.loads(out.read_text())["runs"][0]
    records, mix = run["records"], SoakMix("stand-in", seed=7)
    assert len(records) == run["summary"]["requests"] > 20
    for rec in records:
        want = mix.request(rec["conversation"])
        assert (rec["endpoint"], rec["stream"], rec["bad"]) == (
            want.endpoint, want.body["stream"], want.bad)  # fmt: skip
        if want.bad:
            assert rec["error"].startswith("HTTP 400")
        elif want.cut_after is not None and want.cut_after <= min(WORDS, want.body["max_tokens"]):
            assert rec["cut"] and rec["output_tokens"] == want.cut_after and rec["error"] is None
        else:
            assert not rec["cut"] and rec["error"] is None
            assert rec["output_tokens"] == min(WORDS, want.body["max_tokens"])
            assert rec["ttft_s"] is not None and rec["latency_s"] is not None
    o = run["summary"]["outcomes"]
    assert o["error"] == 0 and o["ok"] and o["cut"] and o["refused"]
    assert sum(o.values()) == len(records)
    assert run["samples"] == [] and run["growth"]["rss_bytes"] == {}  # no --admin
    text = capsys.readouterr().out
    assert f"{o['cut']} cut by the client, {o['refused']} bad fields refused, 0 errors" in text
    assert "growth after the 10 min warm-up: - (no --admin to sample)" in text
