"""Fuzz the HTTP layer of a REAL daemon (two tiny engine processes): never a 5xx.

Hypothesis builds request bodies from the request schema: a valid body of random
optional fields, then up to two fields set to anything (the wire widths' edges, wrong
JSON types, lone surrogates, any JSON); plus deep nesting, and raw bytes under random
content types. Each answer must be a whole 200 (JSON or SSE without an error event) or a
4xx with OpenAI's error body; afterwards the same engine processes still serve.
"""

from __future__ import annotations

import http.client
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trd.frontend.body import MAX_DEPTH
from trd.frontend.schema import ChatRequest, CompletionRequest
from trd.protocol import PARAMS_LAYOUT, int_range

from daemon_fixture import Daemon, start_daemon, write_config

MODEL = "small+large"
JSON = "application/json"


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]
) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("schema_fuzz")
    d = start_daemon(write_config(tmp, tiny_models, ["small", "large"]))
    yield d
    assert d.stop() == 0, d.log()


def wire_edges(field: str) -> list[int]:
    lo, hi = int_range(PARAMS_LAYOUT[field])
    return [lo - 1, lo, hi, hi + 1]


texts = st.text(max_size=12)
lone = st.tuples(texts, st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])).map("".join)
scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | texts | lone
junk = st.recursive(
    scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(texts, c, max_size=3), max_leaves=8
)
ids = st.lists(st.integers(0, 2047), min_size=1, max_size=6)
stops = st.text(min_size=1, max_size=4)
parts = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": texts}), max_size=2)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant"]),
     "content": texts | parts}
)  # fmt: skip
NOOPS: dict[str, list[Any]] = {
    "best_of": [None, 1], "echo": [None, False],
    "suffix": [None, ""], "presence_penalty": [None, 0, 0.0],
    "frequency_penalty": [None, 0.0], "repetition_penalty": [None, 1.0],
    "logit_bias": [None, {}], "tools": [None, []], "tool_choice": [None, "none", "auto"],
    "response_format": [None, {"type": "text"}], "min_p": [None, 0, 0.0],
    "use_beam_search": [None, False], "length_penalty": [None, 1.0],
    "prompt_logprobs": [None], "allowed_token_ids": [None], "bad_words": [None, []],
    "logits_processors": [None],
    "skip_special_tokens": [None, True], "spaces_between_special_tokens": [None, True],
    "truncate_prompt_tokens": [None], "guided_json": [None], "guided_regex": [None],
    "guided_choice": [None], "guided_grammar": [None], "structural_tag": [None],
    "structured_outputs": [None], "priority": [None, 0, -3, 7],
    "chat_template": [None],
}  # fmt: skip
# Values the schema accepts, per field (min_tokens may still exceed max_tokens).
VALID: dict[str, st.SearchStrategy[Any]] = {
    "model": st.just(MODEL),
    "max_tokens": st.integers(1, 4),
    "max_completion_tokens": st.integers(1, 4),
    "min_tokens": st.integers(0, 4),
    # Tiny values too: logits / 1e-300 overflows, and a top_p of 5e-324 is 0 in float32.
    "temperature": st.floats(0, 2) | st.sampled_from([5e-324, 1e-300, 1e-40, 2.0]),
    "top_p": st.floats(0, 1, exclude_min=True) | st.sampled_from([5e-324, 1e-300, 1e-40]),
    "top_k": st.integers(-1, 50) | st.just(wire_edges("top_k")[2]),
    "seed": st.integers(0, wire_edges("seed")[2]),
    "stop": st.none() | stops | st.lists(stops, max_size=3),
    "stop_token_ids": st.lists(st.integers(0, 2047), max_size=3),
    "ignore_eos": st.booleans(),
    "include_stop_str_in_output": st.booleans(),
    "return_token_ids": st.booleans(),
    "n": st.integers(1, 3),
    "logprobs": st.none() | st.booleans() | st.integers(0, 3),  # chat: bool; completions: int
    "top_logprobs": st.integers(0, 3),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries(
        {}, optional={"include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}
    ),
    "user": texts,
    **{name: st.sampled_from(values) for name, values in NOOPS.items()},
    "prompt": texts.filter(bool) | ids | st.tuples(texts.filter(bool) | ids).map(list),
    "messages": st.lists(message, min_size=1, max_size=3),
    "add_generation_prompt": st.booleans(),
    "continue_final_message": st.just(False),  # with add_generation_prompt true: a 400
    "chat_template_kwargs": st.dictionaries(st.sampled_from(["enable_thinking", "x"]), junk),
    # One of three keys; a threshold off the policy's scale is a 400 naming it.
    "routing": st.none()
    | st.fixed_dictionaries({"large_share": st.floats(0, 1, exclude_min=True, exclude_max=True)})
    | st.fixed_dictionaries({"threshold": st.floats(0, 2)})
    | st.fixed_dictionaries({"model": st.sampled_from(["small", "large", "mid"])}),
    "unknown_field": junk,  # ignored
}
EDGES = {"max_tokens": "max_tokens", "max_completion_tokens": "max_tokens",
         "min_tokens": "min_tokens", "top_k": "top_k", "seed": "seed"}  # fmt: skip
# Anything: valid, at and past the wire's edges, a lone surrogate, any JSON at all.
ANY = {
    name: valid
    | st.sampled_from(wire_edges(EDGES[name]) if name in EDGES else [None])
    | lone
    | junk
    for name, valid in VALID.items()
}


def test_the_fuzz_covers_every_field_of_the_schema() -> None:
    fields = set(CompletionRequest.model_fields) | set(ChatRequest.model_fields)
    assert fields | {"unknown_field"} == set(VALID)


@st.composite
def bodies(draw: st.DrawFn, main: str) -> bytes:
    """A valid body of random optional fields, then up to two fields set to anything."""
    other = "messages" if main == "prompt" else "prompt"
    required = {k: VALID[k] for k in ("model", main, "max_tokens")}
    optional = {k: v for k, v in VALID.items() if k not in required and k != other}
    body = draw(st.fixed_dictionaries(required, optional=optional))
    for name in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=2, unique=True)):
        body[name] = draw(ANY[name])
    return json.dumps(body).encode()


def nested(depth: int) -> bytes:
    head = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1})[:-1].encode()
    return head + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"


PATHS = ["/v1/completions", "/v1/chat/completions"]
requests = st.one_of(
    st.tuples(st.just(PATHS[0]), bodies("prompt"), st.just(JSON)),
    st.tuples(st.just(PATHS[1]), bodies("messages"), st.just(JSON)),
    st.tuples(st.sampled_from(PATHS), st.binary(max_size=64),
              st.sampled_from([JSON, "text/plain", "", "application/json; charset=latin-1"])),
    st.tuples(st.just(PATHS[0]), st.integers(MAX_DEPTH - 3, 3 * MAX_DEPTH).map(nested),
              st.just(JSON)),
)  # fmt: skip


def post(d: Daemon, path: str, body: bytes, ctype: str) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": ctype} if ctype else {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def check(status: int, ctype: str, raw: bytes) -> None:
    assert status < 500, raw
    if ctype.startswith("text/event-stream"):
        assert status == 200 and raw.endswith(b"data: [DONE]\n\n"), raw
        events = [json.loads(e[6:]) for e in raw.split(b"\n\n")[:-2]]
        assert all("error" not in e for e in events), raw
        return
    assert ctype.startswith(JSON), (status, ctype, raw)
    body = json.loads(raw)
    if status >= 400:
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], body
        assert err["param"] is None or err["message"].startswith(f"{err['param']}: "), body
    else:
        assert status == 200 and body["choices"], body


def fuzz(daemon: Daemon, examples: int) -> Counter[int]:
    """`examples` bodies (the same ones every run: the derandomised profile, conftest.py);
    how often each status came back."""
    statuses: Counter[int] = Counter()

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(request=requests)
    def one(request: tuple[str, bytes, str]) -> None:
        status, ctype, raw = post(daemon, *request)
        statuses[status] += 1
        check(status, ctype, raw)

    one()
    print("fuzz answers:", dict(statuses))
    return statuses


def serves_on(daemon: Daemon) -> None:
    body = {"model": MODEL, "prompt": "def f(", "max_tokens": 4, "temperature": 0}
    status, _, raw = post(daemon, PATHS[0], json.dumps(body).encode(), JSON)
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 4
    assert daemon.proc.poll() is None
    log = daemon.log()
    assert "died" not in log and "restarting" not in log and "Traceback" not in log, log


def test_no_body_gets_a_5xx_and_the_daemon_serves_on(daemon: Daemon) -> None:
    statuses = fuzz(daemon, 50)
    # It reached both the engines and the validator.
    assert statuses[200] >= 10 and statuses.total() - statuses[200] >= 10, statuses
    serves_on(daemon)


@pytest.mark.slow
def test_many_more_bodies_get_no_5xx(daemon: Daemon) -> None:
    statuses = fuzz(daemon, 600)
    assert statuses[200] >= 100 and statuses.total() - statuses[200] >= 100, statuses
    serves_on(daemon)
