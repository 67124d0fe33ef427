"""The one load client: streamed OpenAI-compatible requests, timed, closed or open loop.

Each request streams (`stream: true`, usage in the last chunk) from `/v1/chat/completions`
or `/v1/completions` and is timed as vLLM's `bench serve` times it:

    TTFT     send -> the first chunk with output (text or token ids)
    ITL      the gaps between later output chunks
    latency  send -> the last output chunk (end to end)
    TPOT     (latency - TTFT) / (output tokens - 1)

Output tokens come from the usage the server reports (else the token ids it returned,
else one per output chunk). The body asks for `"return_token_ids": true` (vLLM's field);
a server that honours it (ours) returns each output token's id and, ours only, the model
that produced it (`token_models`), and its usage `tokens_per_model`: the record then has
the producers, the handoffs and an identity digest of (ids, producers). A server that
returns none of it leaves those fields None, never an error; a server whose ids disagree
with its own usage fails that request (a field that lies must not be measured).
`extra_body` (`--extra-body JSON`) is merged into every request's body last: a server's
own fields, e.g. tokenrouterd's `{"routing": {"large_share": 0.2}, "priority": 1}`.

Load: conversations start in the dataset's order. Closed loop: `max_concurrency` N keeps
N conversations in flight, a finished one replaced at once by the next. Open loop:
`request_rate` R starts conversations at Poisson arrivals (exponential gaps of mean 1/R
from a seeded generator), with `max_concurrency` as a cap when both are given. Within a
conversation each turn is sent when the previous answer is in, with the answers so far
(`datasets.Conversation`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from tqdm import tqdm

from trd.bench.datasets import Conversation, Part
from trd.bench.identity import digest_ids, digest_output, digest_text

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass
class Record:
    """One request: what was sent, when, and what came back."""

    conversation: int
    turn: int
    prompt: str  # digest of the prompt as sent (token ids or text)
    sent: float  # seconds after the run's start
    ttft: float | None = None
    latency: float | None = None
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None  # the server's usage
    output_tokens: int = 0
    counted_by: str = "usage"  # or "token_ids", "chunks": where output_tokens came from
    text: str = ""
    token_ids: list[int] | None = None
    models: list[str] | None = None  # producer of each output token (ours)
    tokens_per_model: dict[str, int] | None = None  # the server's usage, in its models' order
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.latency is None or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    @property
    def handoffs(self) -> int | None:
        """Changes of producing model between consecutive output tokens."""
        return (
            None if self.models is None else sum(a != b for a, b in itertools.pairwise(self.models))
        )

    @property
    def output(self) -> str | None:
        """Identity digest: the output token ids AND the model that produced each."""
        if self.token_ids is None or self.models is None:
            return None
        return digest_output(self.token_ids, self.models)

    def to_dict(self) -> dict[str, Any]:
        """What the JSON keeps: timings, counts, digests (ids and text stay in memory),
        and the producers as one digit a token, the model's index in tokens_per_model."""
        names = list(self.tokens_per_model or {})
        producers = None
        if self.models is not None and set(self.models) <= set(names):
            producers = "".join(str(names.index(m)) for m in self.models)
        return {
            "conversation": self.conversation, "turn": self.turn, "prompt": self.prompt,
            "sent_s": self.sent, "ttft_s": self.ttft, "latency_s": self.latency,
            "tpot_s": self.tpot, "itl_s": [round(x, 6) for x in self.itl],
            "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
            "counted_by": self.counted_by, "text": digest_text(self.text),
            "output": self.output, "producers": producers,
            "tokens_per_model": self.tokens_per_model, "handoffs": self.handoffs,
            "error": self.error,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class Settings:
    base_url: str  # without /v1
    model: str
    endpoint: str = "chat"  # of ENDPOINTS
    max_tokens: int = 256
    temperature: float = 0.0  # greedy
    ignore_eos: bool = False  # every request makes exactly max_tokens tokens
    token_ids: bool = True  # ask for return_token_ids
    api_key: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every body, last


def json_object(text: str) -> dict[str, Any]:
    """`--extra-body`'s value: a JSON object, or an error argparse shows with the option."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def add_extra_body_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--extra-body", type=json_object, default={}, metavar="JSON",
                   help="fields merged into every request's body, e.g. "
                   "'{\"routing\": {\"large_share\": 0.2}}' (tokenrouterd's own)")  # fmt: skip


def base_url(url: str) -> str:
    """The server's root URL: `http://host:port`, a trailing `/v1` or `/` dropped."""
    return url.rstrip("/").removesuffix("/v1")


def headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def served_model(session: aiohttp.ClientSession, url: str, api_key: str | None) -> str:
    """The first model `GET /v1/models` lists (the default `--model`)."""
    async with session.get(f"{base_url(url)}/v1/models", headers=headers(api_key)) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}/v1/models: HTTP {resp.status}: {await resp.text()}")
        body = await resp.json()
    if not body.get("data"):
        raise RuntimeError(f"{url}/v1/models lists no model")
    return str(body["data"][0]["id"])


class Client:
    def __init__(self, session: aiohttp.ClientSession, settings: Settings) -> None:
        self.session, self.s = session, settings
        self.url = base_url(settings.base_url) + ENDPOINTS[settings.endpoint]

    def body(self, conv: Conversation, turn: int, answers: Sequence[Record]) -> dict[str, Any]:
        """The request of turn `turn`: the conversation so far, the previous answers in it."""
        s = self.s
        body: dict[str, Any] = {
            "model": s.model, "max_tokens": s.max_tokens, "temperature": s.temperature,
            "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        if s.ignore_eos:
            body["ignore_eos"] = True
        if s.token_ids:
            body["return_token_ids"] = True
        if s.endpoint == "chat":
            body["messages"] = chat_messages(conv, turn, answers)
        else:
            body["prompt"] = completion_prompt(conv, turn, answers)
        return {**body, **s.extra_body}

    async def conversation(
        self, index: int, conv: Conversation, start: float, bar: tqdm[Any] | None = None,
        pace: Mapping[tuple[int, int], float] | None = None,
    ) -> list[Record]:  # fmt: skip
        """Every turn of `conv`, each sent once the previous answer is in (and, with
        `pace`, not before its time in it); stops at a failed turn."""
        records: list[Record] = []
        for turn in range(len(conv.turns)):
            wait = start + (pace or {}).get((index, turn), 0.0) - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                body = self.body(conv, turn, records)
            except ValueError as exc:
                records.append(Record(index, turn, "", time.perf_counter() - start, error=str(exc)))
                break
            prompt = body.get("prompt", body.get("messages"))
            record = Record(index, turn, digest_prompt(prompt), time.perf_counter() - start)
            await self.send(body, record)
            records.append(record)
            if bar is not None:
                bar.update()
            if not record.ok:
                break
        return records

    async def send(self, body: dict[str, Any], rec: Record) -> None:
        """Stream one request into `rec` (its error set if it failed)."""
        sent = time.perf_counter()
        last = sent
        usage: dict[str, Any] = {}
        chunks = 0
        try:
            async with self.session.post(
                self.url, json=body, headers=headers(self.s.api_key)
            ) as resp:
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
                    return
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line.removeprefix("data:").strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        rec.error = f"error event: {chunk['error']}"
                        return
                    if chunk.get("usage"):
                        usage = chunk
                    if not self._take(chunk, rec):
                        continue
                    now = time.perf_counter()
                    if rec.ttft is None:
                        rec.ttft = now - sent
                    else:
                        rec.itl.append(now - last)
                    last, chunks = now, chunks + 1
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
            return
        rec.latency = last - sent if rec.ttft is not None else None
        self._count(rec, usage, chunks)

    @staticmethod
    def _take(chunk: dict[str, Any], rec: Record) -> bool:
        """Add a chunk's output to `rec`; whether it carried any."""
        got = False
        for choice in chunk.get("choices") or []:
            text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            ids = choice.get("token_ids")
            rec.text += text
            if ids:
                rec.token_ids = (rec.token_ids or []) + list(ids)
                if choice.get("token_models") is not None:
                    rec.models = (rec.models or []) + list(choice["token_models"])
            got = got or bool(text) or bool(ids)
        return got

    @staticmethod
    def _count(rec: Record, usage: dict[str, Any], chunks: int) -> None:
        """Output tokens from the usage (else ids, else chunks); check the ids against it."""
        counts = usage.get("usage") or {}
        rec.prompt_tokens = counts.get("prompt_tokens")
        if usage.get("tokens_per_model"):
            rec.tokens_per_model = dict(usage["tokens_per_model"])
        if counts.get("completion_tokens") is not None:
            rec.output_tokens = int(counts["completion_tokens"])
        elif rec.token_ids is not None:
            rec.output_tokens, rec.counted_by = len(rec.token_ids), "token_ids"
        else:
            rec.output_tokens, rec.counted_by = chunks, "chunks"
        ids = rec.token_ids
        if ids is not None and len(ids) != rec.output_tokens:
            rec.error = f"{len(ids)} token ids returned, usage says {rec.output_tokens} tokens"
        elif rec.models is not None and ids is not None and len(rec.models) != len(ids):
            rec.error = f"{len(rec.models)} token_models for {len(ids)} token ids"
        elif rec.models is not None and rec.tokens_per_model is not None:
            said = {k: v for k, v in rec.tokens_per_model.items() if v}
            if dict(Counter(rec.models)) != said:
                rec.error = f"token_models count {dict(Counter(rec.models))}, usage says {said}"


def chat_messages(conv: Conversation, turn: int, answers: Sequence[Record]) -> list[dict[str, str]]:
    parts = [conv.system, *conv.turns[: turn + 1]]
    if any(isinstance(p, list) for p in parts):
        raise ValueError("token-id prompts go to --endpoint completions, not chat")
    msgs = [{"role": "system", "content": str(conv.system)}] if conv.system is not None else []
    for t in range(turn + 1):
        msgs.append({"role": "user", "content": str(conv.turns[t])})
        if t < turn:
            msgs.append({"role": "assistant", "content": answers[t].text})
    return msgs


def completion_prompt(conv: Conversation, turn: int, answers: Sequence[Record]) -> Part:
    """System, turns and answers joined: token ids when the parts are ids (each answer's
    ids, which the server must have returned), else text, parts on lines of their own."""
    parts: list[Part] = [] if conv.system is None else [conv.system]
    for t in range(turn + 1):
        parts.append(conv.turns[t])
        if t < turn:
            ids = answers[t].token_ids
            if isinstance(conv.turns[t], list) and ids is None:
                raise ValueError("a token-id conversation needs the server to return the "
                                 "answers' token ids (return_token_ids)")  # fmt: skip
            parts.append(ids if isinstance(conv.turns[t], list) and ids is not None
                         else answers[t].text)  # fmt: skip
    id_parts = [p for p in parts if isinstance(p, list)]
    if len(id_parts) == len(parts):
        return [i for p in id_parts for i in p]
    if id_parts:
        raise ValueError("a conversation mixes text and token ids")
    return "\n".join(str(p) for p in parts) if len(parts) > 1 else str(parts[0])


def digest_prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
        return digest_ids(prompt)
    return digest_text(
        json.dumps(prompt, sort_keys=True) if not isinstance(prompt, str) else prompt
    )


def arrivals(count: int, rate: float, seed: int) -> list[float]:
    """Start times (seconds) of `count` conversations: all at 0 for an infinite rate, else
    a Poisson process of `rate` per second from `seed` (the first at 0)."""
    if math.isinf(rate):
        return [0.0] * count
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def run_load(
    client: Client, convs: Sequence[Conversation], *, max_concurrency: int | None = None,
    request_rate: float = math.inf, seed: int = 0, label: str = "",
    pace: Mapping[tuple[int, int], float] | None = None,
) -> tuple[list[Record], float]:  # fmt: skip
    """Every conversation under the load described in the module docstring; the records
    (conversation by conversation, turn by turn) and the run's wall time."""
    starts = arrivals(len(convs), request_rate, seed)
    gate = asyncio.Semaphore(max_concurrency or len(convs) or 1)
    total = sum(len(c.turns) for c in convs)
    bar = tqdm(total=total, desc=label, unit="req", leave=False, dynamic_ncols=True,
               file=sys.stderr)  # fmt: skip

    async def one(i: int) -> list[Record]:
        delay = start + starts[i] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        async with gate:
            return await client.conversation(i, convs[i], start, bar, pace)

    start = time.perf_counter()
    try:
        done = await asyncio.gather(*(one(i) for i in range(len(convs))))
    finally:
        bar.close()
    return [r for records in done for r in records], time.perf_counter() - start
