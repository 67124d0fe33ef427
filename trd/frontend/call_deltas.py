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


def required_calls(text: str) -> list[tuple[str | None, str]]:
    """The calls in a (possibly unfinished) "required" array: each one's name (None until
    its string is closed) and its "parameters" value's text so far (a prefix of the
    whole value's text while it is being written)."""
    calls: list[list[Any]] = []  # per call: [name, parameters' start, parameters' end]
    depth, in_str, escaped, start, key, expect_key = 0, False, False, 0, "", True

    def ends_here(i: int) -> None:  # a value of the call's "parameters" ends before i
        if key == "parameters" and calls[-1][1] is not None and calls[-1][2] is None:
            calls[-1][2] = i

    for i, ch in enumerate(text):
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
                if depth == 2 and expect_key:
                    key = json.loads(text[start : i + 1])
                elif depth == 2 and key == "name":
                    calls[-1][0] = json.loads(text[start : i + 1])
                elif depth == 2:
                    ends_here(i + 1)
            continue
        opens_value = depth == 2 and not expect_key and key == "parameters"
        if opens_value and calls[-1][1] is None and not ch.isspace():
            calls[-1][1] = i  # an object, array, string, number, true, false or null
        if ch == '"':
            in_str, start = True, i
        elif ch in "{[":
            depth += 1
            if depth == 2:
                calls.append([None, None, None])
                expect_key = True
        elif ch in "}]":
            if depth == 3:
                ends_here(i + 1)
            elif depth == 2:
                ends_here(i)
            depth -= 1
        elif depth == 2 and ch == ":":
            expect_key = False
        elif depth == 2 and ch == ",":
            ends_here(i)
            expect_key = True
    return [(name, "" if begin is None else text[begin:end]) for name, begin, end in calls]


class CallDeltas:
    """The deltas of a named or "required" choice's calls: `feed` takes the whole output
    so far and gives what is new since the last call."""

    def __init__(self, choice: str, name: str = "") -> None:
        self.choice, self.name = choice, name
        self.ids: list[str] = []
        self.sent: list[int] = []  # per call: characters of its arguments sent

    def feed(self, text: str) -> list[dict[str, Any]]:
        found = [(self.name, text)] if self.choice == "named" else required_calls(text)
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
