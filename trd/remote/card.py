"""The model card: what a remote engine tells the daemon about itself at each connection.

The daemon holds no copy of a remote model, so the checks its config makes of a local
model are made here, on what the remote engine sends once both sides proved the token:

    name, index, models    the same config: same models in the same order (the index of
                           each model is its node id on the rings and in every message)
    policy                 the same routing policy name (its parameters may name files
                           that live at different paths on each host)
    context                the longest sequence the engine serves >= max_model_len
    tokenizer              the parts of tokenizer.json that define ids <-> text, compared
                           with the entry model's like a local model's (tokenizers.py)
    pid, kv_pages, page_size, dtype, device, host    what `trctl status` shows

A card that fails a check is a configuration error: the daemon does not retry it.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from trd.engines.spec import EngineSpec
from trd.models.tokenizers import COMPONENTS, TokenizerFile, first_difference, read_tokenizer
from trd.protocol import Ready
from trd.remote.spec import RemoteSpec

TOKENIZER_PARTS = ("model", "added_tokens", *COMPONENTS)
_INTS = ("index", "context", "vocab_limit", "pid", "kv_pages", "page_size")


class CardError(ValueError):
    """The remote engine is not the one this config describes; the message says why."""


def model_card(spec: EngineSpec, model_names: list[str], ready: Ready) -> dict[str, Any]:
    """The card of the engine `spec` runs (on the remote host, once it is ready)."""
    tok = read_tokenizer(spec.checkpoint.path)
    return {
        "name": spec.name, "index": spec.index, "models": model_names,
        "policy": spec.policy.name, "context": spec.context,
        "vocab_limit": spec.checkpoint.vocab_limit,
        "tokenizer": None if tok is None else {k: tok.data.get(k) for k in TOKENIZER_PARTS},
        "pid": ready.pid, "kv_pages": ready.kv_pages, "page_size": ready.page_size,
        "dtype": spec.dtype, "device": spec.device, "host": socket.gethostname(),
    }  # fmt: skip


def check_card(card: dict[str, Any], spec: RemoteSpec) -> Ready:
    """The Ready the daemon's group expects of this engine; CardError if it is not ours."""
    for key in _INTS:
        if isinstance(card.get(key), bool) or not isinstance(card.get(key), int):
            raise CardError(f"its model card has no integer {key!r}")
    if card.get("models") != list(spec.model_names) or card["index"] != spec.index:
        raise CardError(f"its config lists the models {card.get('models')}, ours "
                        f"{list(spec.model_names)}: both hosts need the same models, in the "
                        "same order")  # fmt: skip
    if card.get("policy") != spec.policy.name:
        raise CardError(f"it routes with policy {card.get('policy')!r}, "
                        f"this daemon with {spec.policy.name!r}")  # fmt: skip
    if card["context"] < spec.max_model_len:
        raise CardError(f"it serves sequences of at most {card['context']} tokens, "
                        f"max_model_len is {spec.max_model_len}: set max_model_len to at most "
                        f"{card['context']}")  # fmt: skip
    _check_tokenizer(card.get("tokenizer"), spec)
    return Ready(spec.index, card["pid"], card["kv_pages"], card["page_size"])


def _check_tokenizer(parts: Any, spec: RemoteSpec) -> None:
    entry = read_tokenizer(spec.entry_dir)
    assert entry is not None  # the config refuses an entry model without tokenizer.json
    name = spec.model_names[0]
    if parts is None:
        raise CardError(f"its checkpoint has no tokenizer.json: cannot check that "
                        f"it shares {name}'s tokenizer")  # fmt: skip
    if not isinstance(parts, dict) or not isinstance(parts.get("model"), dict):
        raise CardError("its model card's tokenizer is not a tokenizers object")
    theirs = TokenizerFile(Path(str(spec.address)), parts)
    difference = first_difference(entry, theirs, name, spec.name)
    if difference:
        raise CardError(f"its tokenizer differs from {name}'s: {difference}; "
                        "routed models must share one tokenizer")  # fmt: skip
