"""The one load client: OpenAI-compatible requests, timed (`load.py` and `soak.py` send them).

A request streams (`stream: true`, usage in the last chunk) from `/v1/chat/completions`
or `/v1/completions` and is timed as vLLM's `bench serve` times it (a body without
`stream` gets one JSON answer: its TTFT is its latency; a stream may be cut, closed by
the client after some chunks, as the long-load mode's are):

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

"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from trd.bench.datasets import Conversation
from trd.bench.record import Record, chat_messages, completion_prompt, digest_prompt

ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


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

    async def turn(
        self, conv: Conversation, turn: int, answers: Sequence[Record], rec: Record
    ) -> None:
        """Send turn `turn` of `conv` and stream its answer into `rec`."""
        try:
            body = self.body(conv, turn, answers)
        except ValueError as exc:
            rec.error = str(exc)
            return
        prompt = body.get("prompt", body.get("messages"))
        rec.prompt = digest_prompt(prompt)
        if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
            rec.prompt_ids = prompt
        await self.send(body, rec)

    async def send(self, body: dict[str, Any], rec: Record, cut_after: int | None = None) -> None:
        """One request into `rec` (its error set if it failed): streamed when the body
        says so, else one JSON answer. With `cut_after`, a stream is abandoned after that
        many output chunks, its connection closed as a client that goes away closes it."""
        sent = time.perf_counter()
        try:
            async with self.session.post(
                self.url, json=body, headers=headers(self.s.api_key)
            ) as resp:
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
                    return
                if body.get("stream"):
                    usage, chunks, last = await self._stream(resp, rec, sent, cut_after)
                else:
                    usage = await resp.json()
                    last = time.perf_counter()
                    rec.ttft, chunks = last - sent, int(self._take(usage, rec))
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
            return
        if rec.error is None and not rec.cut:
            rec.latency = last - sent if rec.ttft is not None else None
            self._count(rec, usage, chunks)

    async def _stream(
        self, resp: aiohttp.ClientResponse, rec: Record, sent: float, cut_after: int | None
    ) -> tuple[dict[str, Any], int, float]:
        """Read an event stream into `rec`: the chunk with the usage, the output chunks,
        when the last came."""
        last, usage, chunks = sent, {}, 0
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
                break
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
            if chunks == cut_after:
                resp.close()
                rec.cut, rec.output_tokens, rec.counted_by = True, chunks, "chunks"
                break
        return usage, chunks, last

    @staticmethod
    def _take(chunk: dict[str, Any], rec: Record) -> bool:
        """Add a chunk's (or a whole answer's) output to `rec`; whether it carried any."""
        got = False
        for choice in chunk.get("choices") or []:
            text = (
                choice.get("text")
                or (choice.get("delta") or choice.get("message") or {}).get("content")
                or ""
            )
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
