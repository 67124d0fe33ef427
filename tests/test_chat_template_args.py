"""vLLM's chat fields over HTTP: add_generation_prompt, continue_final_message and
chat_template_kwargs reach the template, and their mistakes are 400s naming the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from trd.frontend.tokens import PromptEncoder

from frontend_wire import MODEL, assert_error, post

# Qwen3's switch, and an assistant turn written in capitals, so that a final message the
# client sends in lower case is not in the rendered text
TEMPLATE = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}"
    "{% if m['role'] == 'assistant' %}{{ m['content'] | upper }}{% else %}{{ m['content'] }}"
    "{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% endif %}"
)


@pytest.fixture(scope="module")
def encoder(
    tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> PromptEncoder:
    """The tiny models' tokenizer with TEMPLATE as its chat template."""
    out = tmp_path_factory.mktemp("template")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_models["small"] / name, out / name)
    (out / "chat_template.jinja").write_text(TEMPLATE)
    return PromptEncoder(out)


def chat(messages: list[dict[str, str]], **fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "messages": messages, "max_tokens": 2, **fields}).encode()


USER = [{"role": "user", "content": "hi"}]
REPLY = [*USER, {"role": "assistant", "content": "ABC"}]


def prompt(encoder: PromptEncoder, body: bytes) -> str:
    ans = post(encoder, "/v1/chat/completions", body)
    assert ans.status == 200, ans.body
    return encoder.decoder.decode(ans.submits[0].prompt.tolist(), skip_special_tokens=False)


@pytest.mark.parametrize(
    ("messages", "fields", "text"),
    [(USER, {}, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
     (USER, {"add_generation_prompt": True, "continue_final_message": False},
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
     (USER, {"add_generation_prompt": False}, "<|im_start|>user\nhi<|im_end|>\n"),
     (USER, {"chat_template_kwargs": {"enable_thinking": False}},
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think></think>"),
     (USER, {"chat_template_kwargs": {"enable_thinking": True}},
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
     # continuing implies no generation prompt; the reply extends "ABC"
     (REPLY, {"continue_final_message": True},
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nABC"),
     (REPLY, {"continue_final_message": True, "add_generation_prompt": False},
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nABC")],
)  # fmt: skip
def test_the_fields_reach_the_template(
    encoder: PromptEncoder, messages: list[dict[str, str]], fields: dict[str, Any], text: str
) -> None:
    assert prompt(encoder, chat(messages, **fields)) == text


@pytest.mark.parametrize(
    ("messages", "fields", "param", "part"),
    [(REPLY, {"continue_final_message": True, "add_generation_prompt": True},
      "continue_final_message", "cannot be true while add_generation_prompt is true"),
     # the template writes "abc" as "ABC": transformers cannot find the final message
     ([*USER, {"role": "assistant", "content": "abc"}], {"continue_final_message": True},
      "continue_final_message", "the chat template refuses them"),
     (USER, {"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs",
      '"messages" cannot be passed to the chat template'),
     (USER, {"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs",
      '"tokenize" cannot be passed'),
     (USER, {"chat_template_kwargs": {"not a name": 1}}, "chat_template_kwargs",
      '"not a name" cannot be passed'),
     (USER, {"chat_template_kwargs": [1]}, "chat_template_kwargs", "valid dictionary"),
     (USER, {"add_generation_prompt": 1}, "add_generation_prompt", "valid boolean"),
     (USER, {"chat_template": "{{ messages }}"}, "chat_template", "only null is supported")],
)  # fmt: skip
def test_mistakes_are_400s_naming_the_field(
    encoder: PromptEncoder,
    messages: list[dict[str, str]],
    fields: dict[str, Any],
    param: str,
    part: str,
) -> None:
    ans = post(encoder, "/v1/chat/completions", chat(messages, **fields))
    assert_error(ans, 400, param)
    assert part in ans.body["error"]["message"], ans.body
