"""A streamed chat choice's tool calls: "auto" holds text back while it may be a call and
sends the calls whole when the choice ends; "required" and a named function stream their
calls as the grammar writes them (`call_deltas.py`). Both in OpenAI's delta shape."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from trd.frontend.call_deltas import CallDeltas
from trd.frontend.choices import Choice
from trd.frontend.responses import Shaper
from trd.frontend.tools import OPEN, Tools, finish_reason


class ToolStream:
    """A streamed choice's text and calls: "auto" sends the text before the first
    <tool_call> (holding any end that may begin one, and a text that starts as a JSON
    object), "required" and named send no text but their calls' deltas; `finish` gives
    what is left to send and the calls."""

    def __init__(self, tools: Tools) -> None:
        self.tools, self.text, self.sent = tools, "", 0
        streamed = tools.choice in ("named", "required")
        self.deltas = CallDeltas(tools.choice, tools.name) if streamed else None

    def feed(self, delta: str) -> tuple[str, list[dict[str, Any]]]:
        """The text to send now, and the tool-call deltas."""
        self.text += delta
        if self.tools.choice == "none":
            self.sent = len(self.text)
            return delta, []
        if self.deltas is not None:
            return "", self.deltas.feed(self.text)
        if self.text.lstrip().startswith("{"):
            return "", []  # maybe one untagged call: all of it held to the end
        cut = self.text.find(OPEN)
        if cut < 0:  # keep back an end that could be the start of <tool_call>
            cut = len(self.text) - next(
                (k for k in range(min(len(OPEN) - 1, len(self.text)), 0, -1)
                 if self.text.endswith(OPEN[:k])), 0)  # fmt: skip
        out, self.sent = self.text[self.sent : max(cut, self.sent)], max(cut, self.sent)
        return out, []

    def finish(self) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
        """(text left to send, call deltas left to send, the calls) at the choice's end."""
        _, calls = self.tools.calls(self.text)
        if self.deltas is not None:
            return "", self.deltas.feed(self.text), calls
        if calls:
            return "", [{"index": i, **call} for i, call in enumerate(calls)], calls
        return self.text[self.sent :], [], []


def with_calls(body: dict[str, Any], deltas: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat chunk carrying tool-call deltas too (its content left out when empty)."""
    if deltas:
        delta = body["choices"][0]["delta"]
        body["choices"][0]["delta"] = {**({"content": delta["content"]} if delta.get("content")
                                          else {}), "tool_calls": deltas}  # fmt: skip
    return body


async def end_tool_stream(
    c: Choice,
    streams: dict[int, ToolStream],
    shaper: Shaper,
    send: Callable[[dict[str, Any]], Awaitable[None]],
    chunk: Callable[[Choice, str | None], dict[str, Any]],
) -> str:
    """At a streamed choice's end: send the text its ToolStream held, then what is left
    of its tool calls; returns the choice's finish reason."""
    if not streams:
        return c.finish_reason
    rest, deltas, calls = streams[c.index].finish()
    if rest:
        await send(chunk(c, rest))
    if deltas:
        await send(shaper.tool_calls_chunk(c.index, deltas))
    return finish_reason(streams[c.index].tools, calls, c.finish_reason)
