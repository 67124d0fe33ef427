"""The tokenizer a GGUF file describes, rebuilt as tokenizer.json + tokenizer_config.json.

llama.cpp keeps no tokenizer.json. The vocabulary, the merges, a type per token
(1 normal, 3 control, 4 user-defined, ...), the NAME of the pre-tokenizer regex set
(`tokenizer.ggml.pre`) and the special token ids are metadata; the chat template is
`tokenizer.chat_template`. Only byte-level BPE (`tokenizer.ggml.model` = gpt2, the form
of SmolLM, Llama 3 and Qwen2/3 vocabularies) is rebuilt here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from trd.models.gguf_meta import GGUFImportError, GGUFMeta

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types that are matched whole in text

# Split patterns of the tokenizers these vocabularies were trained with (Llama 3's and
# Qwen2's published pre-tokenizers); llama.cpp names them in tokenizer.ggml.pre.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
_GPT2_STYLE = ("default", "gpt2", "smollm")


def _pre_tokenizer(meta: GGUFMeta) -> pre_tokenizers.PreTokenizer:
    pre = meta.get("tokenizer.ggml.pre", str, "default")
    if pre in _SPLITS:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if pre not in _GPT2_STYLE:
        raise GGUFImportError(
            f"{meta.src}: tokenizer.ggml.pre {pre!r} is not supported "
            f"(supported: {sorted((*_SPLITS, *_GPT2_STYLE))})"
        )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":  # SmolLM's own tokenizer splits digits one by one before GPT-2's regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level


def _special(meta: GGUFMeta, tokens: list[str], name: str) -> str | None:
    key = f"tokenizer.ggml.{name}_token_id"
    token_id = meta.get(key, int, None)
    if token_id is None:
        return None
    if not 0 <= token_id < len(tokens):
        raise GGUFImportError(f"{meta.src}: {key} {token_id} is outside the vocabulary")
    return tokens[token_id]


def build_tokenizer(meta: GGUFMeta) -> tuple[Tokenizer, dict[str, Any]]:
    """The tokenizer and the tokenizer_config.json fields (special tokens, chat template)."""
    kind = meta.get("tokenizer.ggml.model", str)
    if kind != "gpt2":
        raise GGUFImportError(
            f"{meta.src}: tokenizer.ggml.model {kind!r} is not supported"
            " (only gpt2, byte-level BPE)"
        )
    tokens: list[str] = meta.get("tokenizer.ggml.tokens", list)
    merges: list[str] = meta.get("tokenizer.ggml.merges", list)
    types: list[int] = meta.get("tokenizer.ggml.token_type", list, [1] * len(tokens))
    if len(types) != len(tokens):
        raise GGUFImportError(
            f"{meta.src}: tokenizer.ggml.token_type has {len(types)} entries,"
            f" tokenizer.ggml.tokens {len(tokens)}"
        )
    # Byte-level vocabularies spell every byte with a printable stand-in; a token that uses
    # other characters (a mislabelled added token) is respelled, as transformers does.
    chars = _byte_chars()
    alphabet = set(chars)
    vocab = {
        t if set(t) <= alphabet else "".join(chars[b] for b in t.encode()): i
        for i, t in enumerate(tokens)
    }
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=False))  # type: ignore[arg-type]
    tok.pre_tokenizer = _pre_tokenizer(meta)
    tok.decoder = decoders.ByteLevel()
    # Control and user-defined tokens are matched whole in text (llama.cpp does the same);
    # only those spelled in the byte alphabet are real entries of this vocabulary.
    whole = [(t, ty) for t, ty in zip(tokens, types, strict=True) if set(t) <= alphabet]
    control = [t for t, ty in whole if ty == CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, ty in whole if ty == USER_DEFINED]
    )
    config = _tokenizer_config(meta, tokens, control)
    tok.post_processor = _post_processor(config, vocab)
    return tok, config


def _tokenizer_config(meta: GGUFMeta, tokens: list[str], control: list[str]) -> dict[str, Any]:
    """tokenizer_config.json: the named special tokens, BOS/EOS flags, the chat template."""
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "extra_special_tokens": control,
        "add_bos_token": meta.get("tokenizer.ggml.add_bos_token", bool, False),
        "add_eos_token": meta.get("tokenizer.ggml.add_eos_token", bool, False),
    }
    for name, field in (("bos", "bos"), ("eos", "eos"), ("unknown", "unk"), ("padding", "pad")):
        text = _special(meta, tokens, name)
        if text is not None:
            config[f"{field}_token"] = text
    template = meta.get("tokenizer.chat_template", str, None)
    if template is not None:
        config["chat_template"] = template
    return config


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte value 0..255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _post_processor(config: dict[str, Any], vocab: dict[str, int]) -> processors.PostProcessor:
    """Prepend BOS / append EOS when the file asks for it (tokenizer.ggml.add_*_token)."""
    before = [config["bos_token"]] if config["add_bos_token"] and "bos_token" in config else []
    after = [config["eos_token"]] if config["add_eos_token"] and "eos_token" in config else []
    return processors.TemplateProcessing(
        single=[*before, "$A", *after],
        special_tokens=[(t, vocab[t]) for t in dict.fromkeys([*before, *after])],
    )


def save_tokenizer(meta: GGUFMeta, out_dir: Path, max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json into out_dir."""
    tok, config = build_tokenizer(meta)
    tok.save(str(out_dir / "tokenizer.json"))
    config["model_max_length"] = max_length
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
