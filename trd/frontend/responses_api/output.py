"""One response's output items, built from its text as it comes, with the stream events
that tell a client each step (OpenAI's Responses streaming shapes, sequence numbers left
to the sender):

    a message   response.output_item.added (status in_progress, no content)
                response.content_part.added (output_text "")
                response.output_text.delta ...
                response.output_text.done, response.content_part.done
                response.output_item.done (status completed, or incomplete if cut off)
    a call      response.output_item.added (function_call, arguments "")
                response.function_call_arguments.delta ...
                response.function_call_arguments.done, response.output_item.done

The text and calls are told apart by chat's tool streaming (`ToolStream`): "auto" holds
back what may be a call and gives the calls whole at the end, "required" and a named
function give each call's arguments as the grammar writes them. A call opens once its
name is known and closes the item before it. A streamed response and one returned
whole are built by the same steps, so they have the same items.
"""

from __future__ import annotations

import uuid
from typing import Any

from trd.frontend.tool_stream import ToolStream
from trd.frontend.tools import Tools

Event = dict[str, Any]


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """An item as it is now (an event's snapshot; the item itself grows on)."""
    if "content" not in item:
        return dict(item)
    return {**item, "content": [dict(part) for part in item["content"]]}


class OutputItems:
    def __init__(self, tools: Tools | None) -> None:
        self.tools = ToolStream(tools) if tools is not None else None
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being written
        self.calls: dict[int, dict[str, Any]] = {}  # a call delta's index -> its item
        self.position: dict[str, int] = {}  # an item's id -> its output_index

    def feed(self, delta: str) -> list[Event]:
        """The events for a piece of the output text."""
        if self.tools is None:
            return self._text(delta)
        text, calls = self.tools.feed(delta)
        return self._text(text) + self._calls(calls)

    def finish(self, cut_off: bool) -> list[Event]:
        """The events that end the output (`cut_off`: by max_output_tokens)."""
        events: list[Event] = []
        if self.tools is not None:
            rest, calls, _ = self.tools.finish()
            events += self._text(rest) + self._calls(calls)
        if not self.items:  # nothing was written: an empty message, as OpenAI gives
            events += self._open_message()
        return events + self._close("incomplete" if cut_off else "completed")

    def _text(self, text: str) -> list[Event]:
        if not text:
            return []
        events = [] if self._writing("message") else self._open_message()
        item = self.open
        assert item is not None
        item["content"][0]["text"] += text
        return [*events, {"type": "response.output_text.delta", **self._where(item),
                          "content_index": 0, "delta": text, "logprobs": []}]  # fmt: skip

    def _calls(self, deltas: list[dict[str, Any]]) -> list[Event]:
        """Chat's tool-call deltas ({index, id, function: {name, arguments}} first, then
        {index, function: {arguments}}) as call items and their argument deltas."""
        events: list[Event] = []
        for d in deltas:
            fn = d["function"]
            if "id" in d:  # a new call: its name is known
                events += self._close("completed")
                item = {"id": _item_id("fc"), "type": "function_call", "status": "in_progress",
                        "call_id": d["id"], "name": fn["name"], "arguments": ""}  # fmt: skip
                self.calls[d["index"]] = item
                events += self._add(item)
            item = self.calls[d["index"]]
            if fn["arguments"]:
                item["arguments"] += fn["arguments"]
                events.append({"type": "response.function_call_arguments.delta",
                               **self._where(item), "delta": fn["arguments"]})  # fmt: skip
        return events

    def _writing(self, kind: str) -> bool:
        return self.open is not None and self.open["type"] == kind

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": self.position[item["id"]]}

    def _add(self, item: dict[str, Any]) -> list[Event]:
        self.position[item["id"]] = len(self.items)
        self.items.append(item)
        self.open = item
        shown = {**item, "content": []} if item["type"] == "message" else _copy(item)
        return [{"type": "response.output_item.added", "output_index": len(self.items) - 1,
                 "item": shown}]  # fmt: skip

    def _open_message(self) -> list[Event]:
        events = self._close("completed")
        item = {"id": _item_id("msg"), "type": "message", "status": "in_progress",
                "role": "assistant", "content": [_part("")]}  # fmt: skip
        events += self._add(item)
        return [*events, {"type": "response.content_part.added", **self._where(item),
                          "content_index": 0, "part": _part("")}]  # fmt: skip

    def _close(self, status: str) -> list[Event]:
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = status
        where = self._where(item)
        if item["type"] == "message":
            part = item["content"][0]
            events = [
                {"type": "response.output_text.done", **where, "content_index": 0,
                 "text": part["text"], "logprobs": []},
                {"type": "response.content_part.done", **where, "content_index": 0,
                 "part": dict(part)},
            ]  # fmt: skip
        else:
            events = [{"type": "response.function_call_arguments.done", **where,
                       "arguments": item["arguments"]}]  # fmt: skip
        return [*events, {"type": "response.output_item.done",
                          "output_index": where["output_index"], "item": _copy(item)}]  # fmt: skip
