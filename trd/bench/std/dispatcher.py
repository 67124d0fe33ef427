"""The standard-serving dispatcher: token-level routing outside the servers, over HTTP.

One ordinary single-model server per model (`server.py`); for every position the
dispatcher sends the full context to the current model's server, reads back the greedy
token and its normalised entropy, and applies R-Stitch itself (the rule of
`trd/policies/rstitch.py` for two models):

    on the small model, H > tau: drop the token, the large model regenerates the position
    on the large model, H <= tau: keep the token, return to the small model
    otherwise keep the token and stay

This is the paper's "Std. Serving": the servers know nothing of the routed request, so
every call re-sends the whole context; a server's prefix cache spares the re-prefill
of the full blocks it has already computed (`std`), a stateless server re-prefills
all of it (`std_nocache`).
"""

from __future__ import annotations

import time

import aiohttp

from trd.bench.load import TokenTarget


class Dispatcher(TokenTarget):
    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: list[str],
        names: list[str],
        tau: float,
        max_tokens: int,
    ) -> None:
        super().__init__(names, max_tokens)
        self.session, self.urls, self.tau = session, urls, tau

    async def _next(self, model: int, seq: list[int]) -> tuple[int, float]:
        async with self.session.post(f"{self.urls[model]}/generate", json={"prompt": seq}) as r:
            body = await r.json()
        return int(body["token"]), float(body["entropy"])

    async def generate(self, ids: list[int]) -> tuple[float, float, list[int], list[int]]:
        start = time.perf_counter()
        seq, cur, ttft = list(ids), 0, 0.0
        models: list[int] = []  # producer of each output token
        while len(models) < self.max_tokens:
            token, h = await self._next(cur, seq)
            unsure = h > self.tau
            if cur == 0 and unsure:
                cur = 1
                continue
            seq.append(token)
            models.append(cur)
            ttft = ttft or time.perf_counter() - start
            if cur == 1 and not unsure:
                cur = 0
        return ttft, time.perf_counter() - start, seq[len(ids) :], models
