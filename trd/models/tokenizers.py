"""Whether two checkpoints share one tokenizer, read from their tokenizer.json files.

Models routed within one response exchange token ids, never text, and the entry
model's tokenizer alone encodes prompts and decodes outputs. So two tokenizers are one
when they define the same two functions:

    encode: text -> ids   normalizer, pre_tokenizer, model (type, vocab, merges, options),
                          added tokens (content, id, matching flags), post_processor
    decode: ids -> text   vocab, added tokens (content, id, special), decoder

and the comparison covers exactly those parts of tokenizer.json (not `version`,
`truncation` or `padding`, which the daemon never uses). The embedding matrices' sizes
play no part: families pad them differently (DeepSeek-R1-Distill-Qwen-1.5B has 151936
rows, -32B 152064, for the same 151665 ids).

The chat template is not compared: the entry model's template formats every
conversation, and its output is ids that mean the same to every model (`config.py`
logs a warning when the templates differ). Torch-free: the supervisor runs this.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trd.models.errors import CheckpointError

TOKENIZER_FILE = "tokenizer.json"
COMPONENTS = ("normalizer", "pre_tokenizer", "post_processor", "decoder")
_ADDED_FLAGS = ("special", "single_word", "lstrip", "rstrip", "normalized")
_SHOWN = 80  # characters of a differing component shown in the message


@dataclass(frozen=True)
class TokenizerFile:
    path: Path
    data: dict[str, Any]

    @property
    def model(self) -> dict[str, Any]:
        model = self.data.get("model")
        return model if isinstance(model, dict) else {}

    def vocab(self) -> dict[str, int]:
        """token -> id of the model's vocabulary (Unigram: pieces by position)."""
        vocab = self.model.get("vocab") or {}
        if isinstance(vocab, list):
            return {str(piece[0]): i for i, piece in enumerate(vocab)}
        return dict(vocab)

    def added(self) -> dict[str, dict[str, Any]]:
        """content -> entry of the added tokens."""
        return {str(t.get("content")): t for t in self.data.get("added_tokens") or []}

    @property
    def vocab_limit(self) -> int:
        """The number of ids the tokenizer can produce: its largest id + 1."""
        ids = [*self.vocab().values(), *(int(t.get("id", -1)) for t in self.added().values())]
        return max(ids, default=-1) + 1


def read_tokenizer(model_dir: Path) -> TokenizerFile | None:
    """The folder's tokenizer.json, or None when it has none."""
    path = Path(model_dir) / TOKENIZER_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise CheckpointError(f"{path}: not a tokenizers file (no 'model' object)")
    return TokenizerFile(path, data)


def first_difference(a: TokenizerFile, b: TokenizerFile, a_name: str, b_name: str) -> str | None:
    """None when a and b are one tokenizer, else the first difference, in words."""
    names = (a_name, b_name)
    for check in (_model_options, _vocab, _merges, _added, _components):
        found = check(a, b, names)
        if found:
            return found
    return None


def _model_options(a: TokenizerFile, b: TokenizerFile, names: tuple[str, str]) -> str | None:
    ma, mb = a.model, b.model
    for key in ["type", *sorted((ma.keys() | mb.keys()) - {"type", "vocab", "merges"})]:
        if ma.get(key) != mb.get(key):
            return (f"tokenizer model {key}: {ma.get(key)!r} in {names[0]}, "
                    f"{mb.get(key)!r} in {names[1]}")  # fmt: skip
    return None


def _vocab(a: TokenizerFile, b: TokenizerFile, names: tuple[str, str]) -> str | None:
    raw_a, raw_b = a.model.get("vocab"), b.model.get("vocab")
    if raw_a == raw_b:
        return None
    va, vb = a.vocab(), b.vocab()
    for (first, second), (na, nb) in (((va, vb), names), ((vb, va), names[::-1])):
        for token, i in sorted(first.items(), key=lambda kv: kv[1]):
            j = second.get(token)
            if j != i:
                there = f"id {j}" if j is not None else "absent"
                return f"token {token!r} is id {i} in {na}, {there} in {nb}"
    if not (isinstance(raw_a, list) and isinstance(raw_b, list)):
        return None
    # Same tokens and ids: a Unigram vocabulary whose scores differ.
    for i, (pa, pb) in enumerate(zip(raw_a, raw_b, strict=False)):
        if pa != pb:
            return (
                f"token {pa[0]!r} (id {i}) has score {pa[1]} in {names[0]}, {pb[1]} in {names[1]}"
            )
    return None


def _merge(m: Any) -> str:
    """A merge as "a b": tokenizers writes either that string or the pair [a, b]."""
    return m if isinstance(m, str) else " ".join(m)


def _merges(a: TokenizerFile, b: TokenizerFile, names: tuple[str, str]) -> str | None:
    ma = [_merge(m) for m in a.model.get("merges") or []]
    mb = [_merge(m) for m in b.model.get("merges") or []]
    if ma == mb:
        return None
    for i in range(max(len(ma), len(mb))):
        x = repr(ma[i]) if i < len(ma) else "absent"
        y = repr(mb[i]) if i < len(mb) else "absent"
        if x != y:
            return f"merge #{i} differs: {x} in {names[0]}, {y} in {names[1]}"
    return None


def _added(a: TokenizerFile, b: TokenizerFile, names: tuple[str, str]) -> str | None:
    ta, tb = a.added(), b.added()
    for (first, second), (na, nb) in (((ta, tb), names), ((tb, ta), names[::-1])):
        for content, entry in sorted(first.items(), key=lambda kv: int(kv[1].get("id", -1))):
            other = second.get(content)
            if other is None:
                return f"added token {content!r}: id {entry.get('id')} in {na}, absent in {nb}"
            if entry.get("id") != other.get("id"):
                return f"added token {content!r}: id {entry.get('id')} vs {other.get('id')}" + (
                    f" ({na} vs {nb})")  # fmt: skip
            for flag in _ADDED_FLAGS:
                if entry.get(flag) != other.get(flag):
                    return (f"added token {content!r}: {flag} {entry.get(flag)} in {na}, "
                            f"{other.get(flag)} in {nb}")  # fmt: skip
    return None


def _components(a: TokenizerFile, b: TokenizerFile, names: tuple[str, str]) -> str | None:
    for key in COMPONENTS:
        ca, cb = a.data.get(key), b.data.get(key)
        if ca != cb:
            return f"{key} differs: {_short(ca)} in {names[0]}, {_short(cb)} in {names[1]}"
    return None


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def chat_template(model_dir: Path) -> str | None:
    """The folder's chat template (chat_template.jinja, else tokenizer_config.json's)."""
    jinja = Path(model_dir) / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    try:
        config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    template = config.get("chat_template") if isinstance(config, dict) else None
    return template if template is None or isinstance(template, str) else json.dumps(template)
