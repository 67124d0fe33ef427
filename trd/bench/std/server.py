"""A standard single-model server: one model, continuous batching, a prefix cache.

    POST /generate {"prompt": [ids]}  ->  {"token": id, "entropy": H}
    GET  /profile                     ->  seconds per phase of a call, and shares

Each call is an ordinary one-token generation over the whole prompt: the caller sends
the full context every time. As vLLM (automatic prefix caching) and SGLang (radix
cache) do, the server keeps the KV of every full block it computed and reuses the
longest cached prefix, so a call prefills only the suffix it has not seen
(`engine.py`); `--no-prefix-cache` makes it stateless, every call re-prefills its
whole context. The normalised entropy of the next-token distribution is returned next
to the greedy token, as a logprobs field would be; it is what an external R-Stitch
dispatcher needs. Requests that arrive while a batch runs join the next one.

    python -m trd.bench.std.server --model DIR --port 9000

With `--port 0` it serves on a free port the OS picks and says which in `--ready-file`
(`trd/bench/server.py` starts it so).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from pathlib import Path

import torch
from aiohttp import web

from trd.bench.std.engine import StdEngine
from trd.bench.std.phases import Profile
from trd.engines.spec import CPU_LINEARS, EngineSettings, EngineSpec
from trd.policies.base import normalized_entropy
from trd.protocol import SamplingParams
from trd.sdnotify import write_ready_file

ONE_TOKEN = SamplingParams(max_tokens=1, ignore_eos=True)


class Server:
    def __init__(self, engine: StdEngine) -> None:
        self.engine = engine
        self.profile = engine.profile
        self.waiters: dict[int, asyncio.Future[tuple[int, float]]] = {}
        self.wake = asyncio.Event()
        self.failure: Exception | None = None  # what stopped the engine loop, if anything

    async def generate(self, request: web.Request) -> web.Response:
        if self.failure is not None:
            raise web.HTTPInternalServerError(text=f"engine loop failed: {self.failure!r}")
        raw = await request.read()  # outside the timer: awaiting it may run other tasks
        with self.profile.time("http_json"):
            prompt = json.loads(raw)["prompt"]
        rid = self.engine.add_request(prompt, ONE_TOKEN)
        fut = self.waiters[rid] = asyncio.get_running_loop().create_future()
        self.wake.set()
        token, entropy = await fut
        with self.profile.time("http_json"):
            return web.json_response({"token": token, "entropy": entropy})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def profile_get(self, request: web.Request) -> web.Response:
        cache = self.engine.cache
        body = {
            **self.profile.snapshot(),
            "prefix_cache": cache is not None,
            "cached_pages": cache.num_cached if cache else 0,
            "evictions": cache.counters.evictions if cache else 0,
        }
        return web.json_response(body)

    async def loop(self) -> None:
        """Step the engine; if it fails, fail every call (now and later), never hang one."""
        try:
            await self._steps()
        except Exception as exc:
            self.failure = exc
            for fut in self.waiters.values():
                if not fut.done():
                    fut.set_exception(exc)
            raise

    async def _steps(self) -> None:
        while True:
            if not self.engine.has_unfinished():
                await self.wake.wait()
                self.wake.clear()
            with self.profile.time("forward"):
                result = self.engine.forward()
                entropies = normalized_entropy(result.forward.logits).tolist() if result else []
            if result is not None:
                self.profile.forwards += 1
                self.profile.fed_tokens += result.fed
                for req, token, h in zip(result.requests, result.tokens, entropies, strict=True):
                    self.engine.commit(req, [token])
                    fut = self.waiters.pop(req.rid)
                    if not fut.done():  # the client may have gone away
                        fut.set_result((token, h))
            await asyncio.sleep(0)  # let queued HTTP requests join the next batch


def make_app(engine: StdEngine) -> web.Application:
    server = Server(engine)

    async def background(app: web.Application):  # type: ignore[no-untyped-def]
        task = asyncio.get_running_loop().create_task(server.loop())
        yield
        task.cancel()

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/generate", server.generate)
    app.router.add_get("/health", server.health)
    app.router.add_get("/profile", server.profile_get)
    app.cleanup_ctx.append(background)
    return app


async def serve(engine: StdEngine, port: int, ready_file: Path | None) -> None:
    runner = web.AppRunner(make_app(engine))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    if ready_file is not None:
        write_ready_file(ready_file, listen=f"127.0.0.1:{runner.addresses[0][1]}")
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--port", type=int, required=True, help="0: a free port (--ready-file)")
    ap.add_argument("--ready-file", type=Path, help="once serving, {pid, listen} as JSON")
    ap.add_argument("--kv-tokens", type=int, default=65536)
    ap.add_argument("--page-size", type=int, default=16, help="tokens per KV page = cache block")
    ap.add_argument("--no-prefix-cache", action="store_true", help="re-prefill every call")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-batch-tokens", type=int, default=EngineSettings().max_batch_tokens,
                    help="tokens one forward feeds at most (the engines' setting)")  # fmt: skip
    ap.add_argument("--cpu-linear", choices=CPU_LINEARS, default="torch",
                    help="float32 linears: torch (BLAS) or onednn (packed)")  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    spec = EngineSpec.of(
        args.model,
        dtype="float32",
        kv_tokens=args.kv_tokens,
        page_size=args.page_size,
        prefix_cache=not args.no_prefix_cache,
        cpu_linear=args.cpu_linear,
        max_batch_tokens=args.max_batch_tokens,
    )
    engine = StdEngine(spec, profile=Profile())
    asyncio.run(serve(engine, args.port, args.ready_file))


if __name__ == "__main__":
    main()
