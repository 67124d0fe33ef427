"""Tool calls read from model text (auto, required, named), held back while streaming, and
tools shown to a chat template that does not know them (the fixtures')."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trd.frontend.openai_api import ApiError, ChatTemplateArgs
from trd.frontend.tokens import PromptEncoder
from trd.frontend.tool_stream import ToolStream
from trd.frontend.tools import Tools, parse_tools

FN: dict[str, Any] = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}}}}  # fmt: skip
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'


def auto(parallel: bool = True) -> Tools:
    tools = parse_tools([FN], "auto", parallel)
    assert tools is not None
    return tools


def test_auto_reads_qwen_tool_call_blocks() -> None:
    content, calls = auto().calls(f"Let me add.\n{CALL}\n{CALL.replace('1', '2')}")
    assert content == "Let me add."
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"a": 1}, {"a": 2}]
    assert {c["function"]["name"] for c in calls} == {"add"} and calls[0]["id"] != calls[1]["id"]
    assert len(auto(parallel=False).calls(CALL + CALL)[1]) == 1
    assert auto().calls("no call here") == ("no call here", [])
    bare = '{"name": "add", "arguments": {"a": 5}}'  # untagged, as Qwen2.5-Coder writes it
    assert auto().calls(bare)[1][0]["function"] == {"name": "add", "arguments": '{"a": 5}'}
    assert auto().calls('{"name": "sub", "arguments": {}}')[1] == []  # not a tool
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert auto().calls(broken) == (broken, [])  # not a call: the text is the answer


def test_required_and_named_read_their_constrained_output() -> None:
    required = parse_tools([FN], "required")
    named = parse_tools([FN], {"type": "function", "function": {"name": "add"}})
    assert required is not None and named is not None
    _, calls = required.calls('[{"name": "add", "parameters": {"a": 3}}]')
    assert calls[0]["function"] == {"name": "add", "arguments": '{"a": 3}'}
    assert required.calls('[{"name": "add", "para') == ('[{"name": "add", "para', [])
    assert named.calls('{"a": 4}')[1][0]["function"] == {"name": "add", "arguments": '{"a": 4}'}


def test_a_stream_holds_back_what_may_be_a_call() -> None:
    stream = ToolStream(auto())
    sent = [stream.feed(d) for d in ["Hi <", "tool", "_call>\n", CALL[12:]]]
    assert "".join(text for text, _ in sent) == "Hi " and sent[0] == ("Hi ", [])
    assert not any(deltas for _, deltas in sent)  # "auto": calls are sent whole at the end
    rest, deltas, calls = stream.finish()
    assert rest == "" and calls[0]["function"]["arguments"] == '{"a": 1}'
    assert deltas == [{"index": 0, **calls[0]}]
    plain = ToolStream(auto())
    assert plain.feed("a <b") == ("a <b", []) and plain.finish() == ("", [], [])
    held = ToolStream(auto())
    assert held.feed("x <tool") == ("x ", []) and held.finish() == ("<tool", [], [])
    obj = ToolStream(auto())
    assert obj.feed('{"a": 1}') == ("", []) and obj.finish() == ('{"a": 1}', [], [])


def joined(deltas: list[dict[str, Any]]) -> dict[int, dict[str, str]]:
    """Deltas joined by index, as the openai client does: {index: {id, name, arguments}}."""
    calls: dict[int, dict[str, str]] = {}
    for d in deltas:
        call = calls.setdefault(d["index"], {"id": "", "name": "", "arguments": ""})
        if "id" in d:  # the first delta of a call: once, with its id and name
            assert not call["id"] and d["type"] == "function"
            call |= {"id": d["id"], "name": d["function"]["name"]}
        call["arguments"] += d["function"]["arguments"]
    return calls


def test_required_and_named_calls_stream_as_they_are_written() -> None:
    required = parse_tools([FN], "required")
    named = parse_tools([FN], {"type": "function", "function": {"name": "add"}})
    assert required is not None and named is not None
    text = ('[{"name": "add", "parameters": {"a": {"b": [1, "x}\\""]}, "c": 2}}, '
            '{"name": "add", "parameters": {}}]')  # fmt: skip
    for tools, out, args in [(required, text, ['{"a": {"b": [1, "x}\\""]}, "c": 2}', "{}"]),
                             (named, '{"a": 4}', ['{"a": 4}'])]:  # fmt: skip
        stream, deltas, pieces = ToolStream(tools), [], 0
        for ch in out:  # a character per token: the worst case for the scanner
            text_sent, got = stream.feed(ch)
            assert text_sent == ""
            deltas += got
            pieces += bool(got)
        rest, last, calls = stream.finish()
        assert rest == ""
        deltas += last
        calls_joined = joined(deltas)
        assert [c["arguments"] for c in calls_joined.values()] == args
        assert {c["name"] for c in calls_joined.values()} == {"add"} and pieces > len(args)
        assert [json.loads(c["function"]["arguments"]) for c in calls] == [
            json.loads(a) for a in args
        ]
    # A call is sent once its name is known, however the object orders its keys.
    late = ToolStream(required)
    assert late.feed('[{"parameters": {"a": 1}') == ("", [])
    first = late.feed(', "name": "add"')[1]
    assert first[0]["function"] == {"name": "add", "arguments": '{"a": 1}'}


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [("x", None, "tools"), ([{"type": "function"}], None, "tools[0]"),
     ([{"type": "function", "function": {"name": ""}}], None, "tools[0].function.name"),
     ([FN], "sometimes", "tool_choice"), (None, "required", "tool_choice"),
     ([FN], {"type": "function", "function": {"name": "sub"}}, "tool_choice.function.name")],
)  # fmt: skip
def test_bad_tools_name_the_field(tools: Any, choice: Any, param: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_tools(tools, choice)
    assert err.value.param == param


def test_a_template_without_tools_gets_them_in_qwens_words(encoder: PromptEncoder) -> None:
    assert "tools" not in str(encoder.hf.chat_template)
    call = {"id": "c1", "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1}'}}  # fmt: skip
    messages: list[dict[str, Any]] = [{"role": "user", "content": "add"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "1"}]  # fmt: skip
    ids = encoder.chat(messages, ChatTemplateArgs(tools=[FN]))
    text = encoder.decoder.decode(ids, skip_special_tokens=False)
    assert "<tools>\n" + json.dumps(FN) + "\n</tools>" in text
    assert CALL in text
    assert "<|im_start|>user\n<tool_response>\n1\n</tool_response><|im_end|>" in text
