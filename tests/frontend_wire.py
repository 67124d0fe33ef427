"""The OpenAI app over aiohttp's test server, with the engines replaced by the wire.

`post` serves one request with the real `OpenAIApi` and the real `Hub`. In place of the
engine processes, `WireGroup` puts each Submit through the real codec (a value that does
not fit the wire fails here as it would there), keeps what decodes, and finishes the
request with a few tokens. The real engines behind HTTP: test_e2e_schema_fuzz.py and
test_e2e_openai.py.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiohttp import test_utils

from trd.frontend.app import OpenAIApi, Served
from trd.frontend.metrics import Metrics
from trd.frontend.tokens import PromptEncoder
from trd.protocol import (
    NO_ROUTING,
    Emit,
    FinishReason,
    RoutingParams,
    SamplingParams,
    Submit,
    decode,
    encode,
)
from trd.supervisor.generation import Generation
from trd.supervisor.hub import Hub, State

MODEL, VOCAB, CONTEXT = "small+large", 2048, 512
OUT_TOKENS = [72, 101, 108]  # what WireGroup "generates"


class WireGroup:
    """Stands in for the engine processes: every Submit is encoded and decoded as on the wire."""

    def __init__(self, failing: int | None = None) -> None:
        self.submits: list[Submit] = []
        self.failing = failing  # the rid the "engine" fails after its first token

    def submit(self, prompt: list[int], params: SamplingParams) -> Generation:
        rid = len(self.submits) + 1
        msg = decode(encode(Submit(rid, np.asarray(prompt, np.int32), params)))
        assert isinstance(msg, Submit)
        self.submits.append(msg)
        gen = Generation(rid, len(prompt))
        loop = asyncio.get_running_loop()
        for i, token in enumerate(OUT_TOKENS):  # one token per engine message, in turn
            finish = FinishReason.LENGTH if i == len(OUT_TOKENS) - 1 else FinishReason.NONE
            tokens, models = np.asarray([token], np.int32), np.asarray([i % 2], np.uint8)
            emit = Emit(rid, i, tokens, models, finish)
            if rid == self.failing and i == 1:
                emit = Emit(rid, i, tokens[:0], models[:0], FinishReason.ERROR, "wire: failed")
            loop.call_soon(gen.on_emit, emit)
        return gen

    def abort(self, rid: int) -> None: ...
    def set_active(self, n: int) -> None: ...


@dataclass
class Answer:
    status: int
    ctype: str
    body: Any
    submits: list[Submit]
    headers: dict[str, str]


def post(
    encoder: PromptEncoder,
    path: str,
    body: bytes,
    ctype: str | None = "application/json",
    max_inflight: int = 8,
    busy: int = 0,
    detached: State | None = None,
    failing: int | None = None,
    policy: str = "rstitch",
    default: RoutingParams = NO_ROUTING,
) -> Answer:
    """Serve one request while `busy` others are in flight; `detached`: the hub has let
    the engines go into that state; `failing`: the engine request (1 = the first of this
    request) that fails after one token; `policy`: the daemon's routing policy; `default`: the
    routing of a request that asks none (policy.request_large_share or request_model)."""

    async def run() -> Answer:
        hub, group = Hub(max_inflight), WireGroup(None if failing is None else busy + failing)
        hub.attach(group)  # type: ignore[arg-type]
        if busy:
            hub.submit([1], [SamplingParams()] * busy)
            del group.submits[:busy]
        if detached is not None:
            hub.detach(detached, f"test: {detached}")
        served = Served(["small", "large"], encoder, CONTEXT, VOCAB, 0, policy, default)
        metrics = Metrics(dict, hub.gens.values, served.model_id, ())
        app = OpenAIApi(served, hub, metrics, max_stored_responses=8).app()
        async with test_utils.TestClient(test_utils.TestServer(app)) as client:
            headers = {} if ctype is None else {"Content-Type": ctype}
            resp = await client.post(path, data=body, headers=headers)
            raw = await resp.read()
        text = raw.decode()
        data = json.loads(text) if resp.content_type == "application/json" else text
        return Answer(resp.status, resp.content_type, data, group.submits, dict(resp.headers))

    return asyncio.run(run())


def completion(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "def f(", "max_tokens": 4, **fields}).encode()


def chat(**fields: Any) -> bytes:
    messages = [{"role": "user", "content": "hi"}]
    return json.dumps({"model": MODEL, "messages": messages, "max_tokens": 4, **fields}).encode()


def events(text: str) -> list[Any]:
    """The JSON events of an SSE body, which must end with [DONE]."""
    datas = [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    return [json.loads(d) for d in datas[:-1]]


def assert_error(ans: Answer, status: int, param: str | None) -> None:
    assert ans.status == status, ans.body
    assert ans.ctype == "application/json"
    err = ans.body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["param"], err["type"]) == (param, "invalid_request_error"), err
    if param is not None:
        assert err["message"].startswith(f"{param}: "), err
    assert ans.submits == []  # nothing reached the engines
