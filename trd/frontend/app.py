"""The OpenAI-compatible HTTP API: completions, chat completions, responses, models,
probes, metrics.

    POST /v1/completions        POST /v1/chat/completions     (both: JSON or SSE stream)
    POST /v1/responses          GET/DELETE /v1/responses/{id} (responses_api/)
    GET  /v1/models             GET  /v1/models/{model}       GET  /version
    POST /tokenize              POST /detokenize              (vLLM's)
    GET  /metrics (trd_* and the vLLM-named gauges)
    GET  /health                liveness: 200 whenever the process answers
    GET  /ready                 readiness: 200 while every engine serves, else 503 + reason

Streams send each text delta as soon as its tokens are committed by whichever engine,
in order. Every error body is OpenAI's `{"error": {message, type, param, code}}`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from trd import version
from trd.frontend.body import MAX_BODY_BYTES, read_json
from trd.frontend.choices import Choice, choice_params, interleaved
from trd.frontend.logprobs import LogprobShaper
from trd.frontend.metrics import Metrics
from trd.frontend.openai_api import (
    ApiError,
    GenRequest,
    bad,
    check_model,
    parse_chat,
    parse_completion,
    parse_detokenize,
    parse_tokenize,
)
from trd.frontend.responses import SSE_HEADERS, Shaper, Usage
from trd.frontend.responses_api.handler import ResponsesApi
from trd.frontend.responses_api.store import ResponseStore
from trd.frontend.routing import RoutingRules
from trd.frontend.stream import TextStream
from trd.frontend.tokens import PromptEncoder
from trd.frontend.tool_stream import ToolStream, end_tool_stream, with_calls
from trd.frontend.tools import finish_reason
from trd.logs import kv
from trd.protocol import NO_ROUTING, RoutingParams, SamplingParams
from trd.supervisor.hub import Hub, Unavailable

log = logging.getLogger("trd.frontend")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Served:
    """What the API serves: one routed model made of `names`, its tokenizer and limits."""

    names: list[str]
    encoder: PromptEncoder
    max_model_len: int
    vocab_size: int  # ids the tokenizer defines (Checkpoint.vocab_limit), not embedding rows
    created: int
    policy: str  # the routing policy's name: what a request's own `routing` may ask
    # The routing of a request that asks none (policy.request_large_share, request_model).
    default: RoutingParams = NO_ROUTING

    @property
    def model_id(self) -> str:
        return "+".join(self.names)

    @property
    def rules(self) -> RoutingRules:
        return RoutingRules(self.policy, tuple(self.names), self.default)


@dataclass(slots=True)
class Outcome:
    """How a request ended, for its log line and metrics."""

    status: int = 200
    finish: str = "error"


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response(exc.body(), status=exc.status, headers=exc.headers)
    except web.HTTPException as exc:  # no such route, wrong method, body too large
        if exc.status < 400:
            raise
        kind = "invalid_request_error" if exc.status < 500 else "server_error"
        err = ApiError(exc.status, f"{exc.reason}: {request.method} {request.path}", type=kind)
        return web.json_response(err.body(), status=exc.status)


class OpenAIApi:
    def __init__(
        self, served: Served, hub: Hub, metrics: Metrics, max_stored_responses: int
    ) -> None:
        self.served, self.hub, self.metrics = served, hub, metrics
        self.responses = ResponsesApi(self, ResponseStore(max_stored_responses, metrics.registry))

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[openai_errors])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        self.responses.add_routes(app.router)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        app.router.add_get("/version", self.version)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/metrics", self.prometheus)
        return app

    def _card(self) -> dict[str, Any]:
        s = self.served
        return {"id": s.model_id, "object": "model", "created": s.created,
                "owned_by": "tokenrouterd", "max_model_len": s.max_model_len,
                "models": s.names}  # fmt: skip

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._card()]})

    async def model(self, request: web.Request) -> web.Response:
        """OpenAI's retrieve: the served model's card, or a 404 naming what is served."""
        check_model(request.match_info["model"], self.served.model_id)
        return web.json_response(self._card())

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": version()})

    async def health(self, request: web.Request) -> web.Response:
        # Engines restarting or a drain are not a reason to kill the process: /ready says so.
        return web.json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        if self.hub.state == "serving":
            return web.json_response({"status": "serving"})
        return web.json_response({"status": self.hub.state, "reason": self.hub.reason}, status=503)

    async def prometheus(self, request: web.Request) -> web.Response:
        body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's: the ids a prompt or a chat becomes, as generation would see them."""
        req = parse_tokenize(await read_json(request), self.served.model_id, self.served.vocab_size)
        enc = self.served.encoder
        if req.messages is not None:
            chat = enc.chat
            ids = await asyncio.to_thread(chat, req.messages, req.template, req.add_special_tokens)
        else:
            assert req.prompt is not None
            ids = await asyncio.to_thread(enc.encode, req.prompt, req.add_special_tokens)
        limit = self.served.max_model_len
        return web.json_response({"count": len(ids), "max_model_len": limit, "tokens": ids})

    async def detokenize(self, request: web.Request) -> web.Response:
        ids = parse_detokenize(
            await read_json(request), self.served.model_id, self.served.vocab_size
        )
        return web.json_response({"prompt": self.served.encoder.decode(ids)})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        req = parse_completion(body, self.served.model_id, self.served.vocab_size)
        return await self._generate(request, req, "completions")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        req = parse_chat(body, self.served.model_id, self.served.vocab_size)
        return await self._generate(request, req, "chat")

    async def prompt(self, req: GenRequest) -> tuple[list[int], SamplingParams]:
        routing = self.served.rules.params(req.source)  # before the prompt's work
        enc = self.served.encoder
        if req.messages is not None:
            ids = await asyncio.to_thread(enc.chat, req.messages, req.template)
        elif isinstance(req.prompt, str):
            ids = await asyncio.to_thread(enc.encode, req.prompt)
        else:
            ids = list(req.prompt or [])
        limit, param = self.served.max_model_len, "messages" if req.chat else "prompt"
        if len(ids) >= limit:
            msg = f"{len(ids)} tokens; the context of {limit} must leave room for output"
            raise bad(param, msg, "context_length_exceeded")
        max_tokens = req.max_tokens or limit - len(ids)
        if len(ids) + max_tokens > limit:
            msg = f"{max_tokens} + the prompt's {len(ids)} tokens exceed the context of {limit}"
            raise bad(req.max_tokens_param, msg, "context_length_exceeded")
        min_tokens = req.source.min_tokens or 0
        if min_tokens > max_tokens:
            msg = f"must be at most the {max_tokens} tokens the context leaves for output"
            raise bad("min_tokens", f"{msg}, got {min_tokens}")
        return ids, req.params(max_tokens, routing)

    def open_choices(
        self, req: GenRequest, prompt: list[int], params: SamplingParams
    ) -> list[Choice]:
        """Submit the request's choices to the engines (a 503 when it cannot be taken)."""
        if req.n > self.hub.max_inflight:
            raise bad("n", f"must be at most max_inflight ({self.hub.max_inflight}), got {req.n}")
        try:
            gens = self.hub.submit(prompt, choice_params(params, req.n))
        except Unavailable as exc:
            kind = "service_unavailable"
            raise ApiError(503, str(exc), None, exc.code, kind, exc.retry_after_s) from None
        decoder = self.served.encoder.decoder
        return [
            Choice(i, g, TextStream(decoder, g.tokens, req.stop, req.keep_stop),
                   LogprobShaper(decoder, req.chat) if params.logprobs is not None else None)
            for i, g in enumerate(gens)
        ]  # fmt: skip

    @asynccontextmanager
    async def serving(
        self, choices: list[Choice], rid: str, endpoint: str
    ) -> AsyncIterator[Outcome]:
        """The handling of submitted choices: whatever happens, their engine requests are
        released and the request is logged and counted with its outcome. A client that
        left while its answer was written (ConnectionResetError) ends here as a 499:
        re-raised, aiohttp would log a traceback as a 500."""
        outcome = Outcome()
        try:
            yield outcome
        except ApiError as exc:
            outcome.status = exc.status
            raise
        except asyncio.CancelledError:
            outcome.status, outcome.finish = 499, "client_gone"  # nginx's code: client left
            raise
        except ConnectionResetError:
            outcome.status, outcome.finish = 499, "client_gone"
        finally:
            for c in choices:
                self.hub.release(c.gen)
            self._record(rid, endpoint, outcome, choices)

    async def _generate(
        self, request: web.Request, req: GenRequest, endpoint: str
    ) -> web.StreamResponse:
        prompt, params = await self.prompt(req)
        choices = self.open_choices(req, prompt, params)
        # The engines log the same hex id (the first choice's), so one grep follows a
        # request everywhere.
        kind = "chatcmpl" if req.chat else "cmpl"
        shaper = Shaper(req.chat, f"{kind}-{choices[0].gen.rid:x}", self.served.model_id)
        async with self.serving(choices, shaper.id, endpoint) as outcome:
            if req.stream:
                return await self._stream(request, req, choices, shaper, outcome)
            parts: list[list[str]] = [[] for _ in choices]
            async with aclosing(interleaved(choices)) as deltas:  # a failed choice stops all
                async for c, delta in deltas:
                    parts[c.index].append(delta or "")
            texts = ["".join(p) for p in parts]
            names, bodies = self.served.names, []
            for c, text in zip(choices, texts, strict=True):
                begin, end = c.span()
                produced = c.produced(names, begin, end) if req.return_token_ids else None
                logprobs = c.shaped_logprobs(begin, end)
                content, calls = req.tools.calls(text) if req.tools else (text, [])
                finish = finish_reason(req.tools, calls, c.finish_reason) if req.tools else None
                finish = finish or c.finish_reason
                counts = c.counts(names)
                bodies.append(shaper.choice(c.index, content, finish, produced, logprobs, calls,
                                            counts))  # fmt: skip
            outcome.finish = ",".join(sorted({c.finish_reason for c in choices}))
            return web.json_response(shaper.final(bodies, self.usage(choices)))
        return web.Response(status=499)  # the client left (`serving`)

    async def _stream(
        self,
        request: web.Request,
        req: GenRequest,
        choices: list[Choice],
        shaper: Shaper,
        outcome: Outcome,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)

        async def send(body: dict[str, Any]) -> None:
            await resp.write(b"data: " + json.dumps(body).encode() + b"\n\n")

        def chunk(c: Choice, delta: str | None, finish: str | None = None) -> dict[str, Any]:
            usage = self.usage(choices) if req.continuous_usage else None
            if delta is None:  # a chat choice's opening: no tokens yet
                return shaper.chunk(c.index, delta, finish, usage)
            begin, end = c.span()
            names = self.served.names
            produced = c.produced(names, begin, end) if req.return_token_ids else None
            logprobs = c.shaped_logprobs(begin, end)
            counts = c.counts(names) if finish is not None else None
            return shaper.chunk(c.index, delta, finish, usage, produced, logprobs, counts)

        if req.chat:
            for c in choices:
                await send(chunk(c, None))
        tools = {c.index: ToolStream(req.tools) for c in choices} if req.tools else {}
        try:
            # aclosing: a client that leaves stops the choices' readers now, not at GC
            async with aclosing(interleaved(choices)) as deltas:
                async for c, delta in deltas:
                    if delta is None:  # that choice ended, after its held text and calls
                        finish = await end_tool_stream(c, tools, shaper, send, chunk)
                        await send(chunk(c, "", finish))
                    else:
                        text, calls = tools[c.index].feed(delta) if tools else (delta, [])
                        await send(with_calls(chunk(c, text), calls))
            outcome.finish = ",".join(sorted({c.finish_reason for c in choices}))
            if req.include_usage:
                await send(shaper.usage_chunk(self.usage(choices)))
        except ApiError as exc:
            # Headers are sent: the error travels as an event (the openai client raises it).
            outcome.status = exc.status
            await send(exc.body())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _record(self, rid: str, endpoint: str, outcome: Outcome, choices: list[Choice]) -> None:
        usage = self.usage(choices)
        now = time.perf_counter()
        gens = [c.gen for c in choices]
        ttfts = [g.ttft for g in gens if g.ttft is not None]
        ttft = min(ttfts) if ttfts else None
        start = gens[0].start
        shares = [c.counts(self.served.names).large_share for c in choices]
        self.metrics.observe(endpoint, outcome.status, usage, ttft, now - start,
                             [s for s in shares if s is not None])  # fmt: skip
        per_model = ",".join(f"{k}:{v}" for k, v in usage.tokens_per_model.items())
        error = next((g.error for g in gens if g.error), "-")
        log.info("request %s", kv(
            id=rid, endpoint=endpoint, status=outcome.status, finish=outcome.finish,
            n=len(choices), prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens, tokens_per_model=per_model,
            switches=usage.model_switches, ttft_ms="-" if ttft is None else f"{ttft * 1e3:.1f}",
            e2e_ms=f"{(now - start) * 1e3:.1f}", error=error,
        ))  # fmt: skip

    def usage(self, choices: list[Choice]) -> Usage:
        models = [c.served_models for c in choices]
        return Usage.of(choices[0].gen.prompt_len, models, self.served.names)
