"""OpenAI's Responses API over routed generation:

    POST   /v1/responses        a response, whole or streamed (SSE events with
                                `event: <type>` lines and sequence numbers)
    GET    /v1/responses/{id}   a stored response
    DELETE /v1/responses/{id}

A request becomes the chat request it means (`request.py`) and runs through chat's
path: the same prompt checks, engines, stop and tool handling, metrics (endpoint
"responses") and log line, under the id `resp_<hex>` the engines log too. A stream
opens with response.created and response.in_progress, tells the output's items as they
are written (`output.py`) and ends with response.completed (response.incomplete when
max_output_tokens cut it off); an engine failure after the headers ends it with an
`error` event and response.failed.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import TypeAdapter

from trd.frontend.body import read_json
from trd.frontend.choices import Choice, interleaved
from trd.frontend.errors import ApiError
from trd.frontend.responses import SSE_HEADERS
from trd.frontend.responses_api.output import Event, OutputItems
from trd.frontend.responses_api.request import (
    Message,
    as_messages,
    chat_request,
    input_messages,
    parse_responses,
    responses_names,
)
from trd.frontend.responses_api.schema import Item, ResponsesRequest
from trd.frontend.responses_api.shape import ResponseShape
from trd.frontend.responses_api.store import ResponseStore, Stored

if TYPE_CHECKING:
    from trd.frontend.app import OpenAIApi, Outcome

Send = Callable[[Event], Awaitable[None]]
_ITEMS = TypeAdapter(list[Item])


async def _write(choice: Choice, output: OutputItems, send: Send | None) -> None:
    """Build the output from the choice's text as it comes (`send`: each step's events)."""
    async with aclosing(interleaved([choice])) as deltas:
        async for _, delta in deltas:
            if delta is None:
                events = output.finish(cut_off=choice.finish_reason == "length")
            else:
                events = output.feed(delta)
            if send is not None:
                for event in events:
                    await send(event)


class ResponsesApi:
    def __init__(self, api: OpenAIApi, store: ResponseStore) -> None:
        self.api, self.store = api, store

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/responses", self.create)
        router.add_get("/v1/responses/{id}", self.retrieve)
        router.add_delete("/v1/responses/{id}", self.delete)

    async def retrieve(self, request: web.Request) -> web.Response:
        return web.json_response(self.store.get(request.match_info["id"]).body)

    async def delete(self, request: web.Request) -> web.Response:
        rid = request.match_info["id"]
        self.store.delete(rid)
        return web.json_response({"id": rid, "object": "response.deleted", "deleted": True})

    async def create(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        served = self.api.served
        req = parse_responses(body, served.model_id, served.vocab_size)
        before: Sequence[Message] = ()
        if req.previous_response_id is not None:
            before = self.store.get(req.previous_response_id, "previous_response_id").conversation
        turns = [*before, *input_messages(req)]
        gen = chat_request(req, body, turns, served.model_id, served.vocab_size)
        with responses_names():
            prompt, params = await self.api.prompt(gen)
        choices = self.api.open_choices(gen, prompt, params)
        shape = ResponseShape(f"resp_{choices[0].gen.rid:x}", req, body, gen, served.model_id)
        output = OutputItems(gen.tools)
        async with self.api.serving(choices, shape.id, "responses") as outcome:
            if gen.stream:
                return await self._stream(request, choices[0], output, shape, req, turns, outcome)
            await _write(choices[0], output, None)
            outcome.finish = choices[0].finish_reason
            return web.json_response(self._final(choices[0], output, shape, req, turns))
        return web.Response(status=499)  # the client left (OpenAIApi.serving)

    def _final(
        self,
        choice: Choice,
        output: OutputItems,
        shape: ResponseShape,
        req: ResponsesRequest,
        turns: list[Message],
    ) -> dict[str, Any]:
        """The finished response, stored unless the request said store: false."""
        status = "incomplete" if choice.finish_reason == "length" else "completed"
        final = shape.body(status, output.items, self.api.usage([choice]))
        if req.store is not False:
            answer = as_messages(_ITEMS.validate_python(output.items))
            self.store.put(shape.id, Stored(final, (*turns, *answer)))
        return final

    async def _stream(
        self,
        request: web.Request,
        choice: Choice,
        output: OutputItems,
        shape: ResponseShape,
        req: ResponsesRequest,
        turns: list[Message],
        outcome: Outcome,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        numbers = itertools.count()

        async def send(event: Event) -> None:
            data = json.dumps({**event, "sequence_number": next(numbers)})
            await resp.write(f"event: {event['type']}\ndata: {data}\n\n".encode())

        started = shape.body("in_progress", [])
        await send({"type": "response.created", "response": started})
        await send({"type": "response.in_progress", "response": started})
        try:
            await _write(choice, output, send)
            final = self._final(choice, output, shape, req, turns)
            outcome.finish = choice.finish_reason
            await send({"type": f"response.{final['status']}", "response": final})
        except ApiError as exc:
            # Headers are sent: the error travels as events (OpenAI's `error`, then the
            # response failed with it).
            outcome.status = exc.status
            await send({"type": "error", "code": exc.code, "message": exc.message,
                        "param": exc.param})  # fmt: skip
            error = {"code": "server_error", "message": exc.message}
            await send({"type": "response.failed",
                        "response": shape.body("failed", output.items, error=error)})  # fmt: skip
        await resp.write_eof()
        return resp
