"""`tokenrouterd engine`: run one model of a daemon's config on this host, for that daemon.

    tokenrouterd engine --config CONFIG --model large --listen 0.0.0.0:7070

    config (the daemon's own file; only --model's checkpoint is read)
      -> this host's memory plan (the daemon's own planner, trd/supervisor/deployment.py,
         one model; handed in by the command line, trd/daemon.py, so that this package
         stays below the supervisor that links to it)
      -> the engine process, with the rings of the edges that touch it -> READY
      -> listen: every connection must pass the handshake (trd/remote/handshake.py) within
         a few seconds, or it is logged and closed; the newest daemon to pass gets the link
      -> a bridge moves frames between the rings and the link until it ends
      -> the engine drops every request (they died with the link) and waits for the next

The engine process outlives links. Exit: 0 on SIGTERM/SIGINT, 1 when the engine dies or
the port cannot be opened, 2 for a bad config or a plan that does not fit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing as mp
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Protocol

import uvloop

from trd.config import Address, Config, ConfigError, load_config, parse_address
from trd.engines.boot import engine_process, without_main
from trd.engines.spec import EngineSpec
from trd.ipc.counters import Counters
from trd.ipc.mesh import Mesh
from trd.ipc.names import FRONTEND, cleanup_stale, instance_prefix
from trd.logs import setup_logging
from trd.memplan.plan import MemoryPlan, PlanError
from trd.protocol import Control, ProtocolError, Ready, decode, encode
from trd.remote import handshake
from trd.remote.bridge import Bridge
from trd.remote.card import model_card
from trd.remote.handshake import HANDSHAKE_S
from trd.remote.spec import RemoteSpec
from trd.sdnotify import write_ready_file

log = logging.getLogger("trd.engine_host")

EXIT_FAILED, EXIT_CONFIG = 1, 2
START_TIMEOUT_S = 600.0
DISCARD_EVERY_S = 0.2


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tokenrouterd engine",
        description="Run one model of a tokenrouterd config on this host and wait for the "
        "daemon to connect (its config names this host in the model's `remote:`).",
        epilog="Both hosts read the same config: `path` is where this host finds the "
        "checkpoint, `remote_token` the secret both prove they know.",
    )
    p.add_argument("--config", type=Path, required=True,
                   help="the daemon's YAML config; only --model's checkpoint is read")  # fmt: skip
    p.add_argument("--model", required=True, help="the name of the model this host runs")
    p.add_argument("--listen", required=True,
                   help="HOST:PORT to accept the daemon on, e.g. 0.0.0.0:7070 (port 0: a free "
                   "port, see --ready-file)")  # fmt: skip
    p.add_argument(
        "--ready-file",
        type=Path,
        metavar="FILE",
        help="once listening, write {pid, listen} here as JSON (the port bound)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p.parse_args(argv)


class Planned(Protocol):
    """What this host needs of a deployment (`trd.supervisor.deployment.Deployment`)."""

    @property
    def specs(self) -> tuple[EngineSpec | RemoteSpec, ...]: ...

    @property
    def plan(self) -> MemoryPlan: ...


def main(argv: list[str], plan_deployment: Callable[[Config], Planned]) -> int:
    args = parse_args(argv)
    try:
        listen = parse_address("--listen", args.listen, allow_unix=False, any_port=True)
        cfg = load_config(args.config, serve=args.model)
        deployment = plan_deployment(cfg)
    except (ConfigError, PlanError, ValueError) as exc:
        print(f"tokenrouterd engine: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    setup_logging(args.log_level)
    spec = next(s for s in deployment.specs if isinstance(s, EngineSpec))
    for line in deployment.plan.to_table().splitlines():
        log.info("memory plan | %s", line)
    return uvloop.run(EngineHost(cfg, spec, listen, args.ready_file).run())


class EngineHost:
    def __init__(
        self, cfg: Config, spec: EngineSpec, listen: Address, ready_file: Path | None = None
    ) -> None:
        self.cfg, self.spec, self.listen, self.ready_file = cfg, spec, listen, ready_file
        self.exit_code = 0
        self.link: asyncio.Task[None] | None = None
        self.card: dict[str, Any] = {}

    async def run(self) -> int:
        self.stop = asyncio.Event()
        self.lock = asyncio.Lock()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        self._start_engine()
        try:
            await self._serve()
        finally:
            await self._shutdown()
        return self.exit_code

    def _start_engine(self) -> None:
        cleanup_stale()
        prefix = instance_prefix(os.getpid(), secrets.token_hex(4))
        n, i = self.spec.num_models, self.spec.index
        self.mesh = Mesh(prefix, n, only=i)
        self.counters = Counters.create(prefix + "counters", n)
        rings = self.mesh.rings
        self.egress = {edge: r for edge, r in rings.items() if edge[0] == i}
        self.ingress = {edge: r for edge, r in rings.items() if edge[1] == i}
        args = (os.getpid(), self.spec, self.mesh.endpoint(i), self.counters)
        self.proc: BaseProcess = mp.get_context("spawn").Process(
            target=engine_process, args=args, name=f"trd-engine-{self.spec.name}", daemon=True
        )
        with without_main():
            self.proc.start()

    async def _serve(self) -> None:
        ready = await self._await_ready()
        if ready is None:
            self.exit_code = EXIT_FAILED
            return
        self.card = model_card(self.spec, [m.name for m in self.cfg.models], ready)
        loop = asyncio.get_running_loop()
        loop.add_reader(self.proc.sentinel, self._engine_died)
        try:
            server = await asyncio.start_server(
                self._on_connection, self.listen.host, self.listen.port
            )
        except OSError as exc:
            log.error("cannot listen on %s: %s", self.listen, exc.strerror)
            self.exit_code = EXIT_FAILED
            return
        bound = replace(self.listen, port=int(server.sockets[0].getsockname()[1]))
        log.info("engine %r ready (pid %d, %d KV pages); waiting for the daemon on %s",
                 self.spec.name, ready.pid, ready.kv_pages, bound)  # fmt: skip
        if self.ready_file is not None:
            write_ready_file(self.ready_file, listen=str(bound))
        discard = loop.create_task(self._discard())
        async with server:
            await self.stop.wait()
        discard.cancel()
        loop.remove_reader(self.proc.sentinel)

    async def _await_ready(self) -> Ready | None:
        ring = self.egress[self.spec.index, FRONTEND]
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.stop.is_set():
            for frame in ring.get_all():
                try:
                    msg = decode(frame)
                except ProtocolError as exc:
                    log.error("dropped a malformed frame from the engine: %s", exc)
                    continue
                if isinstance(msg, Ready):
                    if msg.error:
                        log.error("engine %r failed to start: %s", self.spec.name, msg.error)
                        return None
                    return msg
            if self.proc.exitcode is not None:
                log.error("engine %r exited with code %s before it was ready", self.spec.name,
                          self.proc.exitcode)  # fmt: skip
                return None
            if time.monotonic() > deadline:
                log.error("engine %r not ready after %.0f s", self.spec.name, START_TIMEOUT_S)
                return None
            await asyncio.sleep(0.05)
        return None

    def _engine_died(self) -> None:
        asyncio.get_running_loop().remove_reader(self.proc.sentinel)
        log.error("engine %r (pid %s) died with exit code %s; stopping", self.spec.name,
                  self.proc.pid, self.proc.exitcode)  # fmt: skip
        self.exit_code = EXIT_FAILED
        self.stop.set()

    # -- links ---------------------------------------------------------------------------
    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peer = _peer(writer)
        try:
            await asyncio.wait_for(
                handshake.serve(reader, writer, self.cfg.remote_token, self.spec.name, self.card),
                HANDSHAKE_S,
            )
        except (ProtocolError, OSError, TimeoutError) as exc:
            problem = str(exc) or f"no handshake within {HANDSHAKE_S:g} s"
            log.warning("refused a connection from %s: %s", peer, problem)
            writer.close()
            return
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        async with self.lock:  # one link at a time: the newest daemon replaces the old one
            if self.link is not None:
                log.warning("daemon at %s connected: it replaces the current link", peer)
                self.link.cancel()
                await asyncio.wait([self.link])
            i = self.spec.index
            bridge = Bridge(reader, writer, self.egress, self.ingress, self.counters,
                            own_slots=self.counters.engine_slots(i))  # fmt: skip
            self.link = asyncio.get_running_loop().create_task(self._run_link(bridge, peer))

    async def _run_link(self, bridge: Bridge, peer: str) -> None:
        log.info("daemon at %s connected", peer)
        try:
            reason = await bridge.run()
            log.warning("link from %s ended: %s", peer, reason)
        except asyncio.CancelledError:
            log.warning("link from %s closed", peer)
        finally:
            if self.link is asyncio.current_task():
                self.link = None
            await self._drop_all()

    async def _drop_all(self) -> None:
        """The daemon's requests died with its link: the engine frees them all."""
        frame = encode(Control(json.dumps({"op": "drop_all"})))
        ring = self.ingress[FRONTEND, self.spec.index]
        while not ring.try_put(frame):
            if self.proc.exitcode is not None:
                return  # nothing left to free
            await asyncio.sleep(0.001)

    async def _discard(self) -> None:
        """With no daemon to read them, the engine's frames (stats, late answers) go."""
        while True:
            if self.link is None:
                for ring in self.egress.values():
                    ring.get_all()
            await asyncio.sleep(DISCARD_EVERY_S)

    async def _shutdown(self) -> None:
        if self.link is not None:
            self.link.cancel()
            await asyncio.wait([self.link])
        if self.proc.exitcode is None:
            self.proc.terminate()
        await asyncio.to_thread(self.proc.join, 5.0)
        if self.proc.exitcode is None:
            self.proc.kill()
            await asyncio.to_thread(self.proc.join)
        self.mesh.unlink_all()
        self.counters.close()
        log.info("stopped")


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
