"""A streamed chat choice's tool calls: text held back while it may be a call, the calls
sent as one delta each in OpenAI's shape when the choice ends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from trd.frontend.choices import Choice
from trd.frontend.responses import Shaper
from trd.frontend.tools import OPEN, Tools, finish_reason


class ToolStream:
    """A streamed choice's text with the tool calls held back: "auto" sends the text
    before the first <tool_call> (holding any end that may begin one, and a text that
    starts as a JSON object), "required" and named send no text; `finish` gives what is
    left to send and the calls."""

    def __init__(self, tools: Tools) -> None:
        self.tools, self.text, self.sent = tools, "", 0

    def feed(self, delta: str) -> str:
        self.text += delta
        if self.tools.choice == "none":
            self.sent = len(self.text)
            return delta
        if self.tools.choice != "auto" or self.text.lstrip().startswith("{"):
            return ""  # no text, or maybe one untagged call: all of it held to the end
        cut = self.text.find(OPEN)
        if cut < 0:  # keep back an end that could be the start of <tool_call>
            cut = len(self.text) - next(
                (k for k in range(min(len(OPEN) - 1, len(self.text)), 0, -1)
                 if self.text.endswith(OPEN[:k])), 0)  # fmt: skip
        out, self.sent = self.text[self.sent : max(cut, self.sent)], max(cut, self.sent)
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        _, calls = self.tools.calls(self.text)
        return ("", calls) if calls else (self.text[self.sent :], [])


async def end_tool_stream(
    c: Choice,
    streams: dict[int, ToolStream],
    shaper: Shaper,
    send: Callable[[dict[str, Any]], Awaitable[None]],
    chunk: Callable[[Choice, str | None], dict[str, Any]],
) -> str:
    """At a streamed choice's end: send the text its ToolStream held, then its tool calls;
    returns the choice's finish reason."""
    if not streams:
        return c.finish_reason
    rest, calls = streams[c.index].finish()
    if rest:
        await send(chunk(c, rest))
    if calls:
        await send(shaper.tool_calls_chunk(c.index, calls))
    return finish_reason(streams[c.index].tools, calls, c.finish_reason)
