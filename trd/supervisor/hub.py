"""Admission: which requests the engines are serving for HTTP handlers, and when to refuse.

A handler `submit`s (refused with `Unavailable` while starting, restarting, draining or
full), reads its `Generation` as it fills, and always ends with `release`, which frees
the request on every engine if it still runs there (client gone, stop string matched).

`state` is what readiness reports: "serving" only while an engine group is attached.
"draining" is final: a group the keeper attaches during a drain takes no new requests.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Literal

from trd.protocol import SamplingParams
from trd.supervisor.generation import Generation
from trd.supervisor.group import EngineGroup

State = Literal["starting", "serving", "restarting", "draining"]


class Unavailable(RuntimeError):
    """The daemon cannot take a request now (HTTP 503); `code` names why, `retry_after_s`
    when to try again (None: not here, the daemon is going away)."""

    def __init__(
        self, message: str, code: str = "unavailable", retry_after_s: int | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.retry_after_s = code, retry_after_s


# Engines start or restart in seconds; a full daemon frees a slot as soon as one ends.
RETRY_RESTART_S, RETRY_OVERLOAD_S = 5, 1


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
        self.group = group
        if self.state != "draining":
            self.state, self.reason = "serving", ""
        self._publish()

    def stop_admitting(self, reason: str) -> None:
        """Refuse new requests from now on (readiness false); those in flight run on."""
        if self.state != "draining":
            self.state, self.reason = "draining", reason

    def detach(self, state: State, reason: str) -> None:
        """Stop using the group; every request still running fails with `reason` (503)."""
        self.group = None
        if self.state != "draining":
            self.state, self.reason = state, reason
        for gen in self.gens.values():
            gen.fail(reason, status=503)

    def submit(self, prompt: Sequence[int], choices: Sequence[SamplingParams]) -> list[Generation]:
        """One engine request per choice (OpenAI's n), all admitted or none."""
        if self.state != "serving" or self.group is None:
            retry = None if self.state == "draining" else RETRY_RESTART_S
            raise Unavailable(f"unavailable: {self.reason}", retry_after_s=retry)
        if len(self.gens) + len(choices) > self.max_inflight:
            asked = "" if len(choices) == 1 else f" and {len(choices)} more asked"
            raise Unavailable(
                f"overloaded: {len(self.gens)} requests in flight{asked}, the limit is "
                f"{self.max_inflight}; retry later", "overloaded", RETRY_OVERLOAD_S,
            )  # fmt: skip
        gens: list[Generation] = []
        try:
            for params in choices:
                gen = self.group.submit(prompt, params)
                self.gens[gen.rid] = gen
                gens.append(gen)
        except RuntimeError as exc:  # an engine died and the keeper has not noticed yet
            for gen in gens:
                self.release(gen)
            raise Unavailable(f"unavailable: {exc}", retry_after_s=RETRY_RESTART_S) from None
        self.idle.clear()
        self._publish()
        return gens

    def release(self, gen: Generation) -> None:
        """The handler is done with `gen`: free it on the engines if it still runs there."""
        if self.gens.pop(gen.rid, None) is None:
            return
        if self.group is not None:
            self.group.abort(gen.rid)
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
