"""Between HTTP handlers and the engine group: admission, per-request token queues, aborts.

The group calls `_on_tokens` from its fd reader callback (on the event loop) with the
(token, model) pairs that became contiguous; each request's queue gets them, and a
`None` when the engines are done with it. A handler consumes its `Generation` and
always ends with `release`, which frees the request on every engine if it is still
running there (client gone, stop string matched).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from typing import Literal

from trd.engines.group import EngineGroup
from trd.engines.tracker import Tracked
from trd.frontend.openai_api import ApiError
from trd.protocol import FinishReason, SamplingParams

State = Literal["starting", "serving", "restarting", "draining"]


class Generation:
    """One request's output as it arrives."""

    def __init__(self, rid: int, prompt_len: int) -> None:
        self.rid = rid
        self.prompt_len = prompt_len
        self.queue: asyncio.Queue[list[tuple[int, int]] | None] = asyncio.Queue()
        self.tokens: list[int] = []
        self.models: list[int] = []  # producing model per token
        self.finish = FinishReason.NONE  # set once the engines are done with it
        self.error = ""
        self.error_status = 500
        self.start = time.perf_counter()
        self.first_token_at: float | None = None

    async def chunks(self) -> AsyncIterator[list[int]]:
        """Token ids in order, a chunk at a time, until the engines finish or fail."""
        while (pairs := await self.queue.get()) is not None:
            if self.first_token_at is None:
                self.first_token_at = time.perf_counter()
            self.tokens.extend(t for t, _ in pairs)
            self.models.extend(m for _, m in pairs)
            yield [t for t, _ in pairs]

    def end(self, finish: FinishReason, error: str = "", status: int = 500) -> None:
        if self.finish is FinishReason.NONE:
            self.finish, self.error, self.error_status = finish, error, status
            self.queue.put_nowait(None)


class Hub:
    def __init__(self, max_inflight: int) -> None:
        self.max_inflight = max_inflight
        self.group: EngineGroup | None = None
        self.state: State = "starting"
        self.reason = "engines are starting"
        self.gens: dict[int, Generation] = {}
        self.idle = asyncio.Event()
        self.idle.set()

    def attach(self, group: EngineGroup) -> None:
        group.listener = self._on_tokens
        self.group, self.state, self.reason = group, "serving", ""
        self._publish()

    def detach(self, state: State, reason: str) -> None:
        """Stop using the group; every request still running fails with `reason` (503)."""
        self.state, self.reason, self.group = state, reason, None
        for gen in self.gens.values():
            gen.end(FinishReason.ERROR, reason, status=503)

    def submit(self, prompt: Sequence[int], params: SamplingParams) -> Generation:
        if self.state != "serving" or self.group is None:
            raise ApiError(503, f"unavailable: {self.reason}", type="service_unavailable")
        if len(self.gens) >= self.max_inflight:
            raise ApiError(
                503, f"overloaded: {len(self.gens)} requests in flight, the limit is "
                f"{self.max_inflight}; retry later", code="overloaded", type="service_unavailable",
            )  # fmt: skip
        try:
            rid = self.group.submit(prompt, params)
        except RuntimeError as exc:  # an engine died and the supervisor has not noticed yet
            raise ApiError(503, f"unavailable: {exc}", type="service_unavailable") from None
        gen = Generation(rid, len(prompt))
        self.gens[rid] = gen
        self.idle.clear()
        self._publish()
        return gen

    def release(self, gen: Generation) -> None:
        """The handler is done with `gen`: free it on the engines if it still runs there."""
        if self.gens.pop(gen.rid, None) is None:
            return
        if self.group is not None:
            if gen.finish is FinishReason.NONE:
                self.group.abort(gen.rid)
            else:
                self.group.forget(gen.rid)
        if not self.gens:
            self.idle.set()
        self._publish()

    async def drain(self, timeout: float) -> bool:
        """Wait until no request is in flight; False if some still are after `timeout`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.idle.wait(), timeout)
        return self.idle.is_set()

    def _publish(self) -> None:
        # The engines' delayed-batching thresholds are indexed by this count.
        if self.group is not None:
            self.group.set_active(len(self.gens))

    def _on_tokens(self, tracked: Tracked, released: list[tuple[int, int]]) -> None:
        gen = self.gens.get(tracked.rid)
        if gen is None:
            return
        if released:
            gen.queue.put_nowait(released)
        if tracked.complete:
            gen.end(tracked.finish, tracked.error)
