"""A standard single-model server: one model, continuous batching, stateless requests.

    POST /generate {"prompt": [ids]}  ->  {"token": id, "entropy": H}

Each call is an ordinary one-token generation over the whole prompt: the server keeps
no state between calls (no prefix cache), so the caller sends the full context every
time. The normalised entropy of the next-token distribution is returned next to the
greedy token, as a logprobs field would be; it is what an external R-Stitch dispatcher
needs. Requests that arrive while a batch runs join the next one.

    .venv/bin/python scripts/baselines/std_server.py --model DIR --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import torch
from aiohttp import web

from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.policies.base import normalized_entropy
from trd.protocol import SamplingParams

ONE_TOKEN = SamplingParams(max_tokens=1, ignore_eos=True)


class Server:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.waiters: dict[int, asyncio.Future[tuple[int, float]]] = {}
        self.wake = asyncio.Event()

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        rid = self.engine.add_request(body["prompt"], ONE_TOKEN)
        fut = self.waiters[rid] = asyncio.get_running_loop().create_future()
        self.wake.set()
        token, entropy = await fut
        return web.json_response({"token": token, "entropy": entropy})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def loop(self) -> None:
        while True:
            if not self.engine.has_unfinished():
                await self.wake.wait()
                self.wake.clear()
            result = self.engine.forward()
            if result is not None:
                entropies = normalized_entropy(result.forward.logits).tolist()
                for req, token, h in zip(result.requests, result.tokens, entropies, strict=True):
                    self.engine.commit(req, [token])
                    self.waiters.pop(req.rid).set_result((token, h))
            await asyncio.sleep(0)  # let queued HTTP requests join the next batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--kv-tokens", type=int, default=65536)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    server = Server(Engine(EngineSpec.of(args.model, dtype="float32", kv_tokens=args.kv_tokens)))

    async def background(app: web.Application):  # type: ignore[no-untyped-def]
        task = asyncio.get_running_loop().create_task(server.loop())
        yield
        task.cancel()

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/generate", server.generate)
    app.router.add_get("/health", server.health)
    app.cleanup_ctx.append(background)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
