"""Where a reasoning step ends, from token ids alone (GlimpRouter's steps).

A step ends at the token after which the response's decoded text ends with "\\n\\n",
or at its `step_tokens`-th token. Engines see ids, not text, so each id gets two facts
from its own text (the tokenizer's decode of that one id, special tokens included):

    trail[id]   its trailing "\\n" characters, counted up to 2
    whole[id]   its text is non-empty and nothing but "\\n" characters

and a response carries one number, `tail`: the trailing "\\n" of its text so far, up to 2.
After token t:

    tail = tail                        if t's text is empty
           min(2, tail + trail[t])     if whole[t]   ("\\n" after "...\\n": a split "\\n\\n")
           trail[t]                    otherwise
    the text ends with "\\n\\n"  <=>  tail == 2

Why this is exact: decoding ids concatenates their bytes (byte-level BPE; SentencePiece
byte fallback) and reads them as UTF-8; "\\n" is the byte 0x0A, which no multi-byte
character contains, so the text's trailing newlines are the bytes' trailing 0x0A and
each token's own decode keeps its trailing newlines. "\\r\\n\\r\\n" does not end a step
(the text does not end with "\\n\\n"); nor do spaces after "\\n\\n". An empty-text token
right after "\\n\\n" ends a (one-token) step: the text still ends with "\\n\\n".
tests/test_glimp.py checks the rule against decoding every prefix of random sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from trd.models.tokenizers import TOKENIZER_FILE


@dataclass(frozen=True)
class StepTable:
    trail: list[int]  # per id: trailing "\n", capped at 2
    whole: list[bool]  # per id: text is all "\n" (and not empty)
    empty: list[bool]  # per id: text is ""

    @classmethod
    def of(cls, texts: list[str]) -> StepTable:
        """The facts of ids 0..len(texts)-1, from each one's text."""
        trail = [min(2, len(t) - len(t.rstrip("\n"))) for t in texts]
        whole = [bool(t) and not t.strip("\n") for t in texts]
        return cls(trail, whole, [not t for t in texts])

    def advance(self, tail: int, token: int) -> int:
        """The text's trailing newline count after `token`."""
        if self.empty[token]:
            return tail
        return min(2, tail + self.trail[token]) if self.whole[token] else self.trail[token]

    def on(self, device: torch.device) -> DeviceTable:
        return DeviceTable(
            torch.tensor(self.trail, dtype=torch.long, device=device),
            torch.tensor(self.whole, dtype=torch.bool, device=device),
            torch.tensor(self.empty, dtype=torch.bool, device=device),
        )


@dataclass(frozen=True)
class DeviceTable:
    """The same facts as tensors, to decide a batch's candidates without a host copy."""

    trail: torch.Tensor
    whole: torch.Tensor
    empty: torch.Tensor

    def advance(self, tail: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        n = self.trail[tokens]
        added = torch.clamp(tail + n, max=2)
        return torch.where(self.empty[tokens], tail, torch.where(self.whole[tokens], added, n))


def token_texts(model_dir: Path, rows: int) -> list[str]:
    """The text of each id 0..rows-1 alone (special tokens as their text; ids the
    tokenizer lacks, such as embedding padding rows, as "")."""
    tok = Tokenizer.from_file(str(Path(model_dir) / TOKENIZER_FILE))
    known = min(rows, tok.get_vocab_size(with_added_tokens=True))
    texts = tok.decode_batch([[i] for i in range(known)], skip_special_tokens=False)
    return texts + [""] * (rows - known)
