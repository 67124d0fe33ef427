"""Output log-probabilities in OpenAI's two shapes.

Each token's value is its log-probability under the model that produced it (the routed
output mixes models; `token_models` with return_token_ids names which), from that
model's logits before temperature, top-k and top-p, as vLLM reports them by default.

    completions: {"tokens": [...], "token_logprobs": [...], "text_offset": [...],
                  "top_logprobs": [{token: logprob, ...}, ...]}   (the chosen token too)
    chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from trd.supervisor.generation import Generation

# JSON has no -inf (a token a min_tokens ban excluded): vLLM's stand-in for it.
FLOOR = -9999.0


class LogprobShaper:
    """One choice's log-probabilities, a span of its output tokens at a time."""

    def __init__(self, decoder: Tokenizer, chat: bool) -> None:
        self.decoder, self.chat = decoder, chat
        self.offset = 0  # completions' text_offset: characters of the token texts so far

    def _text(self, token: int) -> str:
        return str(self.decoder.decode([token], skip_special_tokens=False))

    def span(self, gen: Generation, begin: int, end: int) -> dict[str, Any]:
        """The shape for output tokens [begin, end) of `gen`."""
        positions = range(begin, end)
        if self.chat:
            return {"content": [self._chat_entry(gen, p) for p in positions], "refusal": None}
        tokens, values, tops, offsets = [], [], [], []
        for p in positions:
            text, lp = self._text(gen.tokens[p]), gen.logprobs[p]
            top = {self._text(t): max(v, FLOOR) for t, v in lp.top}
            tokens.append(text)
            values.append(max(lp.logprob, FLOOR))
            tops.append({**top, text: values[-1]})
            offsets.append(self.offset)
            self.offset += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops,
                "text_offset": offsets}  # fmt: skip

    def _chat_entry(self, gen: Generation, pos: int) -> dict[str, Any]:
        lp = gen.logprobs[pos]
        top = [self._entry(t, v) for t, v in lp.top]
        return {**self._entry(gen.tokens[pos], lp.logprob), "top_logprobs": top}

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        text = self._text(token)
        return {"token": text, "logprob": max(logprob, FLOOR), "bytes": list(text.encode())}
