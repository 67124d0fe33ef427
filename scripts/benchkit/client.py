"""The closed-loop load client and the per-request record every system produces.

N workers each keep one request in flight; a finished request is replaced at once by
the next job in the list, so the offered load is exactly N for the whole run. A
system is an async function `send(prompt, max_tokens) -> Record`; the client only
times the run and shows progress.

Every record carries the output token ids and the model that produced each one, so
outputs are compared by ids and producers, never by decoded text (two id sequences
can decode to the same text, and text says nothing of which model wrote it).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tqdm import tqdm

from trd.bench.identity import digest_ids, digest_output


@dataclass
class Record:
    prompt: list[int] = field(repr=False)
    ttft: float  # seconds from send to the first output token
    latency: float  # seconds from send to the last output token
    token_ids: list[int] = field(repr=False)
    models: list[str] = field(repr=False)  # producer of each output token

    @property
    def output_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_model(self) -> dict[str, int]:
        return dict(Counter(self.models))

    @property
    def handoffs(self) -> int:
        """Changes of producing model between consecutive output tokens."""
        return sum(a != b for a, b in itertools.pairwise(self.models))

    @property
    def tpot(self) -> float:
        return (self.latency - self.ttft) / max(1, self.output_tokens - 1)

    def to_dict(self, names: Sequence[str]) -> dict[str, Any]:
        """What the JSON keeps: timings, counts, digests (ids stay in memory), and the
        producers as one digit per token, the model's index in `names` ("0010")."""
        return {
            "prompt": digest_ids(self.prompt), "output": digest_output(self.token_ids, self.models),
            "producers": "".join(str(names.index(m)) for m in self.models),
            "ttft": self.ttft, "latency": self.latency, "tpot": self.tpot,
            "output_tokens": self.output_tokens, "tokens_per_model": self.tokens_per_model,
            "handoffs": self.handoffs,
        }  # fmt: skip


Send = Callable[[list[int], int], Awaitable[Record]]


async def closed_loop(
    send: Send, prompts: Sequence[list[int]], max_tokens: int, n: int, label: str = ""
) -> tuple[list[Record], float]:
    """Run every prompt with `n` in flight; return the records (in prompt order) and wall."""
    records: list[Record | None] = [None] * len(prompts)
    jobs = iter(range(len(prompts)))
    bar = tqdm(total=len(prompts), desc=label, unit="req", leave=False, dynamic_ncols=True)

    async def worker() -> None:
        for i in jobs:
            records[i] = await send(prompts[i], max_tokens)
            bar.update()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(n, len(prompts)))))
    wall = time.perf_counter() - start
    bar.close()
    return [r for r in records if r is not None], wall


class OpenAIClient:
    """Streams `/v1/completions` (token-id prompts, greedy, EOS ignored) from one server.

    It asks for `return_token_ids` and checks that the ids and producers it got agree
    with the usage the server reports, so a field that lies fails the run."""

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str) -> None:
        self.session, self.url, self.model = session, url.rstrip("/"), model

    async def send(self, prompt: list[int], max_tokens: int) -> Record:
        body = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True},
        }  # fmt: skip
        start = time.perf_counter()
        ttft, ids, models, usage = 0.0, [], [], {}
        async with self.session.post(f"{self.url}/v1/completions", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{self.url}: HTTP {resp.status}: {await resp.text()}")
            async for line in resp.content:
                data = line.decode().strip().removeprefix("data: ")
                if not data or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RuntimeError(f"{self.url}: error event: {chunk['error']}")
                for choice in chunk["choices"]:
                    ttft = ttft or (time.perf_counter() - start if choice["token_ids"] else 0.0)
                    ids += choice["token_ids"]
                    models += choice["token_models"]
                if "usage" in chunk:
                    usage = chunk
        record = Record(prompt, ttft, time.perf_counter() - start, ids, models)
        got = (len(ids), len(models), record.tokens_per_model, record.handoffs)
        per_model = {k: v for k, v in usage["tokens_per_model"].items() if v}
        said = (usage["usage"]["completion_tokens"], len(ids), per_model, usage["model_switches"])
        if got != said:
            raise RuntimeError(f"{self.url}: token ids/models {got} disagree with usage {said}")
        return record
