"""The choices of one request (OpenAI's `n`): one engine request each, read together.

Each choice is its own Generation on the engines and its own TextStream with the
request's stop strings. A stream interleaves the choices' deltas in the order their
tokens are committed; each chunk names its choice's index.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from trd.frontend.logprobs import LogprobShaper
from trd.frontend.openai_api import ApiError
from trd.frontend.responses import Produced, Usage
from trd.frontend.stream import TextStream
from trd.protocol import PARAMS_LAYOUT, FinishReason, SamplingParams, int_range
from trd.supervisor.generation import Generation

SEED_SPAN = int_range(PARAMS_LAYOUT["seed"])[1] + 1


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """Each choice's sampling: a given seed becomes seed + index (wrapped to the wire's
    range), so the choices differ and a request sent again gets the same ones."""
    if params.seed is None:
        return [params] * n
    return [replace(params, seed=(params.seed + i) % SEED_SPAN) for i in range(n)]


@dataclass(eq=False)
class Choice:
    index: int
    gen: Generation
    text: TextStream
    logprobs: LogprobShaper | None  # when the request asks for them
    sent: int = 0  # output tokens a chunk has carried the ids or log-probabilities of

    @property
    def finish_reason(self) -> str:
        stopped = self.text.stopped or self.gen.finish is FinishReason.STOP
        return "stop" if stopped else "length"

    @property
    def served_models(self) -> list[int]:
        """Producing model per token served: a stop string ends the output early."""
        return self.gen.models[: self.text.read]

    def counts(self, names: list[str]) -> Usage:
        """This choice's usage: its tokens served, and who wrote them."""
        return Usage.of(self.gen.prompt_len, [self.served_models], names)

    def span(self) -> tuple[int, int]:
        """The output tokens served since the last call: [the last span's end, now)."""
        begin, self.sent = self.sent, self.text.read
        return begin, self.sent

    def produced(self, names: list[str], begin: int, end: int) -> Produced:
        """The ids of output tokens [begin, end) and the models that made them."""
        gen = self.gen
        return Produced(gen.tokens[begin:end], [names[m] for m in gen.models[begin:end]])

    def shaped_logprobs(self, begin: int, end: int) -> dict[str, Any] | None:
        return None if self.logprobs is None else self.logprobs.span(self.gen, begin, end)

    async def deltas(self) -> AsyncIterator[str]:
        """The text as it is committed, until it ends or a stop string matches."""
        gen, text = self.gen, self.text
        while not gen.complete:
            await gen.changed.wait()
            gen.changed.clear()
            delta = text.update()
            if delta:
                yield delta
            if text.stopped:
                return
        if gen.finish is FinishReason.ERROR:
            kind = {503: "service_unavailable", 504: "timeout"}.get(
                gen.error_status, "server_error"
            )
            raise ApiError(gen.error_status, gen.error, type=kind, code="engine_error")
        tail = text.finish()
        if tail:
            yield tail


async def interleaved(
    choices: list[Choice],
) -> AsyncGenerator[tuple[Choice, str | None], None]:
    """(choice, delta) as each choice's text comes, then (choice, None) when it ends.
    A choice that fails raises here; the others are then left unread."""
    if len(choices) == 1:  # no tasks for the common case
        (choice,) = choices
        async for delta in choice.deltas():
            yield choice, delta
        yield choice, None
        return
    queue: asyncio.Queue[tuple[Choice, str | None] | ApiError] = asyncio.Queue()

    async def pump(choice: Choice) -> None:
        try:
            async for delta in choice.deltas():
                queue.put_nowait((choice, delta))
            queue.put_nowait((choice, None))
        except ApiError as exc:
            queue.put_nowait(exc)

    tasks = [asyncio.create_task(pump(c)) for c in choices]
    running = len(choices)
    try:
        while running:
            item = await queue.get()
            if isinstance(item, ApiError):
                raise item
            yield item
            running -= item[1] is None
    finally:
        for task in tasks:
            task.cancel()
