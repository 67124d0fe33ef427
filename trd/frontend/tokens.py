"""The entry model's tokenizer: prompts and chat messages to token ids, ids to text."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from trd.frontend.openai_api import ApiError, ChatTemplateArgs
from trd.frontend.tool_template import template_messages


class PromptEncoder:
    def __init__(self, model_dir: Path) -> None:
        self.hf = AutoTokenizer.from_pretrained(str(model_dir))
        # The Rust tokenizer decodes without transformers' per-call overhead.
        self.decoder: Tokenizer = self.hf.backend_tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int]) -> str:
        return str(self.decoder.decode(ids, skip_special_tokens=True))

    def chat(
        self,
        messages: list[dict[str, Any]],
        args: ChatTemplateArgs | None = None,
        add_special_tokens: bool = False,  # the template writes them; vLLM's /tokenize may ask
    ) -> list[int]:
        args = args or ChatTemplateArgs()
        if not self.hf.chat_template:
            raise ApiError(400, "this model has no chat template; use /v1/completions")
        messages, specs = template_messages(messages, args.tools, str(self.hf.chat_template))
        tools: list[dict[Any, Any] | Callable[..., Any]] | None = (
            None if specs is None else list(specs)
        )
        try:
            text = self.hf.apply_chat_template(
                messages,
                tools=tools,
                add_generation_prompt=args.add_generation_prompt,
                continue_final_message=args.continue_final_message,
                tokenize=False,
                **args.variables,
            )
        except (TemplateError, TypeError, ValueError) as exc:
            # The template's raise_exception, a variable of the wrong type, or a final
            # message the template does not write as it was given: a client mistake.
            param = _blamed(exc, args)
            raise ApiError(400, f"{param}: the chat template refuses them: {exc}", param) from None
        assert isinstance(text, str)  # tokenize=False: the rendered text
        return self.encode(text, add_special_tokens)


def _blamed(exc: Exception, args: ChatTemplateArgs) -> str:
    """The request field a chat template's refusal is about."""
    if isinstance(exc, ValueError) and args.continue_final_message:
        return "continue_final_message"  # transformers cannot find the final message
    return "chat_template_kwargs" if args.variables else "messages"
