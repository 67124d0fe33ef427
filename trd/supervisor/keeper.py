"""The engine group's keeper: start it, watch it on the event loop, restart it, stop it.

    start() --READY--> serving --an engine dies--> restarting --READY--> serving
                                                        | (retries used up)
                                                        v
                                                     fatal: the daemon exits non-zero

The group's fds (the front end's wakeup eventfd, one sentinel per engine process) are
loop readers. When an engine dies, the group has already failed its in-flight requests;
the keeper closes the whole group (unlinking its rings) and starts a new one after a
backoff. `max_retries` restarts in a row are allowed; the count starts over once a
group has served for RESET_AFTER_S, and after a remote engine's lost connection, which
is no engine failing: its link reconnects with backoff as the group starts again (the
local engines are restarted with it, so no request outlives the link half-served).
A housekeeping task retries frames queued for full rings and fails requests the
engines stopped reporting on (`stall_timeout_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from dataclasses import replace
from typing import Any

from trd.config import Config
from trd.engines.memory import Trimmer
from trd.logs import StderrTap
from trd.policies.params import PolicySpec
from trd.remote.spec import RemoteSpec
from trd.supervisor.deployment import Spec
from trd.supervisor.group import EngineGroup, EngineStartError
from trd.supervisor.hub import Hub, State

log = logging.getLogger("trd.keeper")

START_TIMEOUT_S = 600.0  # loading a large checkpoint from a cold disk takes minutes
RESET_AFTER_S = 300.0
QUEUED_RETRY_S = 0.002  # while frames wait for ring space
HOUSEKEEPING_S = 0.5


class EngineKeeper:
    def __init__(
        self, cfg: Config, specs: tuple[Spec, ...], hub: Hub, tap: StderrTap | None
    ) -> None:
        self.cfg, self.hub, self.tap = cfg, hub, tap
        self.specs = specs
        self.group: EngineGroup | None = None
        self.restarts = 0
        self.attempts = 0  # restarts in a row
        self.started_at = 0.0
        self.fatal: asyncio.Event = asyncio.Event()
        self.fatal_reason = ""
        self._restarting: asyncio.Task[None] | None = None
        self._housekeeping: asyncio.Task[None] | None = None
        self.trimmer = Trimmer()  # the supervisor's heap, as each engine's (memory.py)
        self._stopping = False

    # -- start / stop -------------------------------------------------------------------
    async def start(self) -> None:
        """Start the engines and attach them; EngineStartError (with log lines) if one fails."""
        group = await asyncio.to_thread(self._start_group)
        self._attach(group)

    def _start_group(self) -> EngineGroup:
        group = EngineGroup(self.specs)
        try:
            group.start(timeout=START_TIMEOUT_S, cancelled=lambda: self._stopping)
        except EngineStartError as exc:
            raise EngineStartError(self._with_log_lines(str(exc))) from None
        if self._stopping:
            # stop() came just as the engines became ready: nobody will attach them now.
            group.close()
            raise EngineStartError("the daemon stopped while the engines were starting")
        return group

    def _with_log_lines(self, message: str) -> str:
        if self.tap is None:
            return message
        # Give the failed engine a moment to flush what it printed before exiting.
        time.sleep(0.2)
        named = [s.name for s in self.specs if re.search(rf"'{re.escape(s.name)}'", message)]
        for name in named:
            lines = self.tap.last_lines(name)
            if lines:
                message += f"\nlast log lines of engine {name!r}:\n  " + "\n  ".join(lines)
        return message

    def cancel_start(self) -> None:
        """Give up a start in progress: the engines being loaded are stopped."""
        self._stopping = True

    async def stop(self, reason: str) -> None:
        """Fail what is still running, stop the engines, unlink every ring."""
        self._stopping = True
        if self._restarting is not None:
            self._restarting.cancel()
        group = self._detach("draining", reason)
        if group is not None:
            await asyncio.to_thread(group.close)

    # -- watching ------------------------------------------------------------------------
    def _attach(self, group: EngineGroup) -> None:
        loop = asyncio.get_running_loop()
        self.group, self.started_at = group, time.monotonic()
        for fd in (group.wakeup_fd, *group.sentinels):
            loop.add_reader(fd, self._on_readable)
        self.hub.attach(group)
        group.on_readable()  # arms the sleep flags so the next frame signals the fd
        self._housekeeping = loop.create_task(self._housekeep(group))

    def _detach(self, state: State, reason: str) -> EngineGroup | None:
        group, self.group = self.group, None
        if group is not None:
            loop = asyncio.get_running_loop()
            for fd in (group.wakeup_fd, *group.sentinels):
                loop.remove_reader(fd)
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            self._housekeeping = None
        self.hub.detach(state, reason)
        return group

    async def _housekeep(self, group: EngineGroup) -> None:
        """Retry frames waiting for ring space; fail requests the engines went silent on."""
        stall = self.cfg.stall_timeout_s
        queued = asyncio.Event()
        group.on_queued = queued.set
        last_check = 0.0
        while True:
            queued.clear()
            if group.flush():
                await asyncio.sleep(QUEUED_RETRY_S)
                continue
            now = time.monotonic()
            if now - last_check >= HOUSEKEEPING_S:
                last_check = now
                for gen in group.fail_stalled(stall):
                    log.error("request %x failed: no progress for %.0f s", gen.rid, stall)
                self.trimmer.tick(now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(queued.wait(), HOUSEKEEPING_S)

    def _on_readable(self) -> None:
        group = self.group
        if group is None:
            return
        group.on_readable()
        if group.dead and self._restarting is None:
            self._restarting = asyncio.get_running_loop().create_task(self._restart())

    # -- restarting ----------------------------------------------------------------------
    async def _restart(self) -> None:
        try:
            await self._restart_loop()
        finally:
            self._restarting = None

    async def _restart_loop(self) -> None:
        assert self.group is not None
        reason = "; ".join(self.group.dead.values())
        links_lost = all(isinstance(self.specs[i], RemoteSpec) for i in self.group.dead)
        if links_lost or time.monotonic() - self.started_at > RESET_AFTER_S:
            self.attempts = 0
        log.error("%s; its requests failed, stopping the other engines", reason)
        group = self._detach("restarting", f"restarting engines after: {reason}")
        assert group is not None
        await asyncio.to_thread(group.close)
        while True:
            if self.attempts >= self.cfg.max_retries:
                self.fatal_reason = (
                    f"{reason}; giving up after {self.attempts} restart(s) "
                    f"(restart.max_retries = {self.cfg.max_retries})"
                )
                log.error("engines failed: %s", self.fatal_reason)
                self.hub.detach("draining", f"engines failed: {reason}")
                self.fatal.set()
                return
            self.attempts += 1
            delay = self.cfg.backoff_s * 2 ** (self.attempts - 1)
            log.warning("restarting the engines in %.1f s (attempt %d of %d)",
                        delay, self.attempts, self.cfg.max_retries)  # fmt: skip
            await asyncio.sleep(delay)
            try:
                await self.start()
            except EngineStartError as exc:
                reason = str(exc)
                continue
            self.restarts += 1
            log.info("engines restarted (%d restart(s) so far)", self.restarts)
            return

    # -- live settings -------------------------------------------------------------------
    def set_thresholds(self, thresholds: dict[str, tuple[int, ...]], max_wait_ms: float) -> None:
        """Apply delayed-batching thresholds now, and to every engine started later."""
        self.specs = tuple(
            replace(
                s,
                thresholds=thresholds.get(s.name, s.thresholds),
                batching=replace(s.batching, max_wait_ms=max_wait_ms),
            )
            for s in self.specs
        )
        if self.group is None:
            return
        for spec in self.specs:
            if spec.index not in self.group.dead:
                self.group.control(
                    spec.index,
                    {"op": "set_thresholds", "thresholds": list(spec.thresholds),
                     "max_wait_ms": spec.batching.max_wait_ms},
                )  # fmt: skip

    def set_policy_threshold(self, tau: float) -> None:
        """The routing policy decides with `tau` now, and in every engine started later."""
        self.specs = tuple(
            replace(s, policy=PolicySpec(s.policy.name, {**s.policy.params, "threshold": tau}))
            for s in self.specs
        )
        if self.group is None:
            return
        for spec in self.specs:
            if spec.index not in self.group.dead:
                self.group.control(spec.index, {"op": "set_policy_threshold", "threshold": tau})

    # -- views ---------------------------------------------------------------------------
    def engine_stats(self) -> dict[str, dict[str, Any]]:
        """The latest Stats body of each live engine, by model name."""
        if self.group is None:
            return {}
        names = {s.index: s.name for s in self.specs}
        return {names[m]: body for m, body in self.group.stats.items() if m not in self.group.dead}

    def engine_state(self, spec: Spec) -> tuple[str, int | None]:
        """("ready" | "dead" | "down", pid) of one engine; a remote one is "connected" or
        "disconnected", with its pid on its own host."""
        group = self.group
        remote = isinstance(spec, RemoteSpec)
        if group is None or spec.index >= len(group.procs):
            return ("disconnected" if remote else "down"), None
        ready = group.ready.get(spec.index)
        if remote:
            up = ready is not None and spec.index not in group.dead
            return ("connected" if up else "disconnected"), ready.pid if ready else None
        pid = ready.pid if ready is not None else group.procs[spec.index].pid
        return ("dead" if spec.index in group.dead else "ready"), pid
