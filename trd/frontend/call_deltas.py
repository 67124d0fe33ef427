"""Tool calls streamed as the grammar writes them, in OpenAI's delta shape.

With tool_choice "required" or a named function the output is constrained to the calls,
so it can be sent while it is written (as OpenAI and vLLM do): a call's first delta once
its name is known (`index`, `id`, `type`, `function.name`, the arguments so far), then
its arguments' text as it grows (`index`, `function.arguments`). Concatenated, a call's
argument fragments are its arguments' text as the model wrote it. "auto" is not streamed
this way: free text may turn out not to be a call, so its calls are sent whole at the end.

    named     the output is the arguments (a JSON object)
    required  the output is [{"name": .., "parameters": {..}}, ..]
"""

from __future__ import annotations

import json
import uuid
from typing import Any


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class RequiredScan:
    """The calls in a (possibly unfinished) "required" array, read as it grows: `calls`
    gives each one's name (None until its string is closed) and its "parameters" value's
    text so far (a prefix of the whole value's text while it is being written). Each
    character is read once, however often the text is given again."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []  # per call: [name, parameters' start, its end]
        self.pos, self.depth, self.start, self.key = 0, 0, 0, ""
        self.in_str = self.escaped = False
        self.expect_key = True

    def calls_in(self, text: str) -> list[tuple[str | None, str]]:
        """`text` extends the text given before."""
        for i in range(self.pos, len(text)):
            self._read(text, i)
        self.pos = len(text)
        return [(name, "" if begin is None else text[begin:end])
                for name, begin, end in self.calls]  # fmt: skip

    def _ends_here(self, i: int) -> None:  # a value of the call's "parameters" ends before i
        call = self.calls[-1]
        if self.key == "parameters" and call[1] is not None and call[2] is None:
            call[2] = i

    def _read(self, text: str, i: int) -> None:
        ch = text[i]
        if self.in_str:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_str = False
                if self.depth == 2 and self.expect_key:
                    self.key = json.loads(text[self.start : i + 1])
                elif self.depth == 2 and self.key == "name":
                    self.calls[-1][0] = json.loads(text[self.start : i + 1])
                elif self.depth == 2:
                    self._ends_here(i + 1)
            return
        opens_value = self.depth == 2 and not self.expect_key and self.key == "parameters"
        if opens_value and self.calls[-1][1] is None and not ch.isspace():
            self.calls[-1][1] = i  # an object, array, string, number, true, false or null
        if ch == '"':
            self.in_str, self.start = True, i
        elif ch in "{[":
            self.depth += 1
            if self.depth == 2:
                self.calls.append([None, None, None])
                self.expect_key = True
        elif ch in "}]":
            if self.depth == 3:
                self._ends_here(i + 1)
            elif self.depth == 2:
                self._ends_here(i)
            self.depth -= 1
        elif self.depth == 2 and ch == ":":
            self.expect_key = False
        elif self.depth == 2 and ch == ",":
            self._ends_here(i)
            self.expect_key = True


class CallDeltas:
    """The deltas of a named or "required" choice's calls: `feed` takes the whole output
    so far and gives what is new since the last call."""

    def __init__(self, choice: str, name: str = "") -> None:
        self.choice, self.name = choice, name
        self.scan = RequiredScan()
        self.ids: list[str] = []
        self.sent: list[int] = []  # per call: characters of its arguments sent

    def feed(self, text: str) -> list[dict[str, Any]]:
        """`text` extends the text given before."""
        found = [(self.name, text)] if self.choice == "named" else self.scan.calls_in(text)
        out: list[dict[str, Any]] = []
        for i, (name, args) in enumerate(found):
            if name is None:
                break  # its name is not written yet: nothing of it, or after it, to send
            if i == len(self.ids):
                self.ids.append(call_id())
                self.sent.append(len(args))
                out.append({"index": i, "id": self.ids[i], "type": "function",
                            "function": {"name": name, "arguments": args}})  # fmt: skip
            elif len(args) > self.sent[i]:
                out.append({"index": i, "function": {"arguments": args[self.sent[i] :]}})
                self.sent[i] = len(args)
        return out
