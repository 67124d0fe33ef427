"""Structured outputs and tool calls through the real daemon, with the official openai client.

Two float64 engine processes on the tiny fixtures, handing each response back and forth
(the scripted schedule). The fixtures write noise, so only the grammar makes their output
valid: a JSON schema (checked with jsonschema), a regex, a choice, a pydantic model
through `chat.completions.parse`, and a tool-calling loop of three turns; streamed and
not. Greedy answers must also be the reference loop's tokens for the very body the
client sent (its own grammar masks, sampling and routing): a parse, and the tool loop's
free (auto) turn. Schemas the grammar library refuses are 400s naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel, Field
from tokenizers import Tokenizer

from trd.frontend.openai_api import parse_chat
from trd.frontend.tokens import PromptEncoder
from trd.models.checkpoint import read_checkpoint
from trd.policies.params import PolicySpec
from trd.protocol import FinishReason
from trd.testing.reference import ReferenceRouter, Trace

from daemon_fixture import SCHEDULE, Daemon, start_daemon, write_config

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "population": {"type": "integer", "minimum": 0, "maximum": 10**7},
        "tags": {"type": "array", "items": {"enum": ["port", "capital"]}, "maxItems": 2},
    },
    "required": ["city", "population", "tags"],
    "additionalProperties": False,
}
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME: dict[str, Any] = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
    "additionalProperties": False}}}  # fmt: skip
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Describe a city as JSON."}]
MAX = 96
NAMES = ["small", "large"]


class City(BaseModel):
    name: str = Field(max_length=10)
    size: Literal["small", "big"]
    river: bool


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]
) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("e2e_structured")
    # The tools system prompt alone is ~400 fixture tokens.
    config = write_config(tmp, tiny_models, NAMES, dtype="float64", max_model_len=2048)
    d = start_daemon(config)
    yield d
    assert d.stop() == 0, d.log()


class Recording:
    """An openai client that keeps the JSON body of each request it sends, so the oracle
    replays exactly what the daemon received."""

    def __init__(self, d: Daemon) -> None:
        self.bodies: list[dict[str, Any]] = []
        keep = lambda request: self.bodies.append(json.loads(request.content))  # noqa: E731
        http = openai.DefaultHttpxClient(event_hooks={"request": [keep]}, timeout=60)
        self.client = openai.OpenAI(base_url=f"{d.url}/v1", api_key="unused", max_retries=0,
                                    http_client=http)  # fmt: skip


@pytest.fixture(scope="module")
def oracle(tiny_models: dict[str, Path]) -> Callable[[dict[str, Any]], Trace]:
    """The reference loop's trace for a chat body, read by the front end's own parser (its
    prompt and grammar), routed by the daemon's policy."""
    paths = [tiny_models[n] for n in NAMES]
    ref = ReferenceRouter(paths, PolicySpec("scripted", {"schedule": SCHEDULE}))
    encoder, vocab = PromptEncoder(paths[0]), read_checkpoint(paths[0]).vocab_limit

    def run(body: dict[str, Any]) -> Trace:
        gen = parse_chat(body, "+".join(NAMES), vocab)
        assert gen.messages is not None and gen.max_tokens is not None
        return ref.run(encoder.chat(gen.messages, gen.template), gen.params(gen.max_tokens))

    return run


def chat(
    daemon: Daemon, stream: bool, client: openai.OpenAI | None = None, **kw: Any
) -> tuple[str, list[Any], str]:
    """The content, tool calls and finish reason of one chat completion."""
    client = client or daemon.client()
    kw.setdefault("max_tokens", MAX)
    if not stream:
        out = client.chat.completions.create(model=daemon.model, **kw)
        msg = out.choices[0].message
        return msg.content or "", list(msg.tool_calls or []), out.choices[0].finish_reason
    # The openai client's own accumulation of streamed deltas (tool-call fragments joined
    # by index), as `client.chat.completions.stream` does.
    state = ChatCompletionStreamState(input_tools=kw.get("tools", openai.omit))
    deltas = 0
    for chunk in client.chat.completions.create(model=daemon.model, stream=True, **kw):
        state.handle_chunk(chunk)
        deltas += sum(len(c.delta.tool_calls or []) for c in chunk.choices)
    final = state.current_completion_snapshot.choices[0]  # (the final one raises at "length")
    calls = list(final.message.tool_calls or [])
    # "required" and named calls stream as written: a first delta, then fragments
    assert deltas > len(calls) or kw.get("tool_choice") in (None, "auto") or not calls
    return final.message.content or "", calls, final.finish_reason


@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_output_validates(daemon: Daemon, stream: bool) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
    for seed in range(3):
        text, _, finish = chat(daemon, stream, messages=ASK, response_format=fmt,
                               temperature=1.0, seed=seed)  # fmt: skip
        assert finish == "stop"
        jsonschema.validate(json.loads(text), SCHEMA)
    # Any object: the noise may write one long key and run out of tokens, but it is JSON.
    text, _, finish = chat(daemon, stream, messages=ASK, response_format={"type": "json_object"})
    assert text.startswith("{") and (finish == "length" or isinstance(json.loads(text), dict))


@pytest.mark.parametrize("stream", [False, True])
def test_regex_and_choice_on_completions(daemon: Daemon, stream: bool) -> None:
    client = daemon.client()
    lark = 'start: "x" /[0-9]{1,4}/ "y"'
    asks = [({"guided_regex": r"[A-Z][a-z]{2,6}-[0-9]{2}"}, r"[A-Z][a-z]{2,6}-[0-9]{2}"),
            ({"structured_outputs": {"choice": ["alpha", "beta", "gamma"]}}, r"alpha|beta|gamma"),
            ({"structured_outputs": {"grammar": lark}}, r"x[0-9]{1,4}y")]  # fmt: skip
    for extra, pattern in asks:
        out = client.completions.create(model=daemon.model, prompt="The code is", max_tokens=MAX,
                                        stream=stream, extra_body=extra)  # fmt: skip
        chunks: list[Any] = list(out) if stream else [out]  # type: ignore[call-overload]
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert re.fullmatch(pattern, text), (extra, text)


def test_parse_with_a_pydantic_model_gives_the_oracles_tokens(
    daemon: Daemon, oracle: Callable[[dict[str, Any]], Trace]
) -> None:
    sent = Recording(daemon)
    out = sent.client.chat.completions.parse(
        model=daemon.model, messages=ASK, response_format=City, max_tokens=MAX, temperature=0,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    city = out.choices[0].message.parsed
    assert isinstance(city, City) and city.size in ("small", "big")
    want = oracle(sent.bodies[-1])
    assert want.finish is FinishReason.STOP and out.choices[0].finish_reason == "stop"
    assert (out.choices[0].model_extra or {})["token_ids"] == want.tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_three_turn_tool_loop(
    daemon: Daemon, stream: bool, oracle: Callable[[dict[str, Any]], Trace], tokenizer_path: Path
) -> None:
    """Call (named, then required), the tool's result, the answer (auto)."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path / "tokenizer.json"))
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in (named, "required"):
        # "required" is an array of calls: without parallel_tool_calls false the noise
        # writes calls until max_tokens
        _, calls, finish = chat(daemon, stream, messages=messages, tools=[WEATHER, TIME],
                                tool_choice=choice, parallel_tool_calls=False)  # fmt: skip
        assert finish == ("stop" if choice is named else "tool_calls") and calls
        call = calls[0]
        assert call.id.startswith("call_") and call.type == "function"
        schema = (WEATHER if call.function.name == "get_weather" else TIME)["function"]
        jsonschema.validate(json.loads(call.function.arguments), schema["parameters"])
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
        ],
    }
    messages += [assistant, {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
    sent = Recording(daemon)
    text, calls, finish = chat(daemon, stream, messages=messages, tools=[WEATHER, TIME],
                               tool_choice="auto", max_tokens=8, temperature=0,
                               client=sent.client)  # fmt: skip
    # The free turn: exactly the oracle's tokens for that body (the fixtures write noise,
    # so it is text cut at max_tokens here), its finish OpenAI's name for the oracle's.
    want = oracle(sent.bodies[-1])
    assert want.finish is FinishReason.LENGTH and finish == "length" and not calls
    assert text == tokenizer.decode(want.tokens, skip_special_tokens=True)


def test_eval_structured_on_the_daemon(daemon: Daemon, tmp_path: Path) -> None:
    """`tokenrouterd eval structured` (5 tasks: 2 JSON, a regex, a choice, a tool call):
    every constrained answer that ended before max_tokens is valid, the masks' time per
    step is the constrained pass's (over 10 times the other's), and the unconstrained
    pass writes each task's constrained length."""
    from trd.evals.structured.run import main as structured

    out = tmp_path / "structured.json"
    argv = ["--base-url", daemon.url, "--every", "10", "--max-tokens", "48",
            "--max-concurrency", "3", "--out", str(out)]  # fmt: skip
    assert structured(argv) == 0
    constrained, free = json.loads(out.read_text())["runs"]
    kinds = [r["task"] for r in constrained["records"]]
    assert kinds == ["json", "json", "regex", "choice", "tool"]
    for rec in constrained["records"]:
        assert rec["valid"] is True or rec["output_tokens"] == 48, rec
    assert constrained["summary"]["valid"]["choice"] == "1/1"
    assert constrained["records"][4]["tool_calls"][0]["name"] == "get_weather"
    masks = [run["summary"]["mask_ms_per_step"] for run in (constrained, free)]
    assert masks[0] > 10 * masks[1]
    assert [r["output_tokens"] for r in free["records"]] == [
        max(1, r["output_tokens"]) for r in constrained["records"]]  # fmt: skip
    assert 0 < constrained["summary"]["large_share"] < 1  # the scripted schedule: both models


@pytest.mark.parametrize(
    ("extra", "param", "part"),
    [({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "nope"}}}}}},
      "response_format.json_schema.schema", "Invalid type: nope"),
     ({"guided_regex": "(ab"}, "guided_regex", "unclosed group"),
     ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
      "tool_choice.function.name", '"nope" is not one of the tools'),
     ({"tools": [{**WEATHER, "function": {"name": "f", "parameters": {"type": "nope"}}}],
       "tool_choice": "required"}, "tools[0].function.parameters", "Invalid type: nope")],
)  # fmt: skip
def test_refused_constraints_are_400s(daemon: Daemon, extra: dict, param: str, part: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        daemon.client().chat.completions.create(model=daemon.model, messages=ASK, extra_body=extra)
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == param and part in body["message"]
    assert chat(daemon, False, messages=ASK, max_tokens=4)[2] == "length"  # still serving


def test_the_soak_mix_leaves_no_request_or_page_behind(daemon: Daemon, tmp_path: Path) -> None:
    """`bench serve --duration` for a few seconds of the soak mix (both endpoints, cut
    streams, bad fields, grammars) with the daemon's memory sampled: no error, and once
    the load has ended no engine holds a request or a KV page (the engines' own counts),
    every process reported its memory. An engine that keeps a request whose client went
    away (Inbox.drop sparing one at a peer: a request and its KV pages for good) fails it."""
    from trd.bench.serve import main as bench_serve

    out = tmp_path / "soak.json"
    argv = ["--base-url", daemon.url, "--admin", daemon.admin, "--duration", "12s", "--seed", "1",
            "--grammars", "0.3", "--max-concurrency", "4", "--sample-every", "4s",
            "--warmup", "1h", "--out", str(out)]  # fmt: skip
    code = bench_serve(argv)
    run = json.loads(out.read_text())["runs"][0]
    o, left = run["summary"]["outcomes"], run["left_behind"]
    assert o["error"] == 0 and o["cut"] and o["refused"], run["summary"]["first_error"]
    assert left == {} and code == 0, left
    assert {r["endpoint"] for r in run["records"]} == {"chat", "completions"}
    assert len(run["samples"]) >= 3
    last = run["samples"][-1]["processes"]
    assert list(last) == ["supervisor", "small", "large"]
    for p in last.values():
        assert p["rss_bytes"] >= p["anon_bytes"] > 0 and p["heap_in_use_bytes"] > 0
        assert p["heap_trims"] >= 0  # each process trims its heap (memory.py's Trimmer)
    for name in ("small", "large"):
        assert last[name]["requests"] == last[name]["kv_pages_used"] == 0
        assert last[name]["finished_remembered"] > 0 and last[name]["prefix_blocks"] > 0
    assert last["small"]["grammars_cached"] > 0
