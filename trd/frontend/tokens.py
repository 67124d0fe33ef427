"""The entry model's tokenizer: prompts and chat messages to token ids, ids to text."""

from __future__ import annotations

from pathlib import Path

from jinja2 import TemplateError
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from trd.frontend.openai_api import ApiError


class PromptEncoder:
    def __init__(self, model_dir: Path) -> None:
        self.hf = AutoTokenizer.from_pretrained(str(model_dir))
        # The Rust tokenizer decodes without transformers' per-call overhead.
        self.decoder: Tokenizer = self.hf.backend_tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text))

    def chat(self, messages: list[dict[str, str]]) -> list[int]:
        if not self.hf.chat_template:
            raise ApiError(400, "this model has no chat template; use /v1/completions")
        try:
            text = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except TemplateError as exc:  # the template's raise_exception: a client mistake
            msg = f"messages: the chat template refuses them: {exc}"
            raise ApiError(400, msg, "messages") from None
        # The template writes the special tokens itself.
        return list(self.hf.encode(text, add_special_tokens=False))
