"""The closed-loop load client and the per-request record every system produces.

N workers each keep one request in flight; a finished request is replaced at once by
the next job in the list, so the offered load is exactly N for the whole run. A
system is an async function `send(prompt, max_tokens) -> Record`; the client only
times the run and shows progress.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
from tqdm import tqdm


@dataclass
class Record:
    ttft: float  # seconds from send to the first output token
    latency: float  # seconds from send to the last output token
    output_tokens: int
    tokens_per_model: dict[str, int]
    handoffs: int  # changes of producing model between consecutive tokens
    text: str = field(repr=False)

    @property
    def tpot(self) -> float:
        return (self.latency - self.ttft) / max(1, self.output_tokens - 1)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tpot": self.tpot}


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
    """Streams `/v1/completions` (token-id prompts, greedy, EOS ignored) from one server."""

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str) -> None:
        self.session, self.url, self.model = session, url.rstrip("/"), model

    async def send(self, prompt: list[int], max_tokens: int) -> Record:
        body = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True},
        }  # fmt: skip
        start = time.perf_counter()
        ttft, parts, usage = 0.0, [], {}
        async with self.session.post(f"{self.url}/v1/completions", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{self.url}: HTTP {resp.status}: {await resp.text()}")
            async for line in resp.content:
                data = line.decode().strip().removeprefix("data: ")
                if not data or data == "[DONE]":
                    continue
                chunk = json.loads(data)
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    ttft = ttft or time.perf_counter() - start
                    parts.append(chunk["choices"][0]["text"])
                if "usage" in chunk:
                    usage = chunk
        return Record(
            ttft=ttft,
            latency=time.perf_counter() - start,
            output_tokens=usage["usage"]["completion_tokens"],
            tokens_per_model=usage["tokens_per_model"],
            handoffs=usage["model_switches"],
            text="".join(parts),
        )
