"""Which small/large pair a router head was trained on, and the check that it is this one.

    model identity  sha256 of the model's config.json (parsed, keys sorted, without the
                    keys that record how a file was written rather than what the model
                    computes: dtype, torch_dtype, transformers_version, _name_or_path)
                    and of tokenizer.json's encode/decode parts (model, added tokens,
                    normalizer, pre_tokenizer, post_processor, decoder)
    pair identity   sha256 of "<small identity>:<large identity>"

A trained head stores both model identities in its metadata (`trd/policies/heads.py`);
the config reader refuses it (`policy.head`) for any other pair, saying which model
differs. Weights are not hashed: two trainings of one architecture on one tokenizer are
one pair to this check, which catches a head moved to other models, not a retrained one.
Torch-free: the supervisor runs it at start.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trd.models.checkpoint import CheckpointError, safetensors_header
from trd.models.tokenizers import COMPONENTS, read_tokenizer
from trd.policies.params import PolicyError

PROVENANCE_KEYS = ("dtype", "torch_dtype", "transformers_version", "_name_or_path")
ZIP_MAGIC = b"PK\x03\x04"  # torch.save writes a zip archive (R2R's published routers)


def model_identity(model_dir: Path) -> str:
    """A hex digest of what the model computes and how it reads and writes text."""
    model_dir = Path(model_dir)
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{model_dir}/config.json: cannot read it ({exc})") from None
    parts: dict[str, Any] = {
        "config": {k: v for k, v in config.items() if k not in PROVENANCE_KEYS}
    }
    tok = read_tokenizer(model_dir)
    if tok is not None:
        parts["tokenizer"] = {key: tok.data.get(key) for key in ("model", *COMPONENTS)}
        parts["added"] = sorted(tok.data.get("added_tokens") or [], key=lambda t: t.get("id", -1))
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


@dataclass(frozen=True, slots=True)
class PairIdentity:
    small: str  # model identities
    large: str
    names: str = ""  # "small folder + large folder", for messages

    @classmethod
    def of(cls, small_dir: Path, large_dir: Path) -> PairIdentity:
        names = f"{Path(small_dir).name}+{Path(large_dir).name}"
        return cls(model_identity(small_dir), model_identity(large_dir), names)

    @property
    def pair(self) -> str:
        return hashlib.sha256(f"{self.small}:{self.large}".encode()).hexdigest()

    def metadata(self) -> dict[str, str]:
        names = {"pair_names": self.names}
        return {"pair": self.pair, "small": self.small, "large": self.large, **names}

    @classmethod
    def from_metadata(cls, meta: dict[str, str]) -> PairIdentity | None:
        if "small" not in meta or "large" not in meta:
            return None  # an untrained (random) head names no pair
        return cls(meta["small"], meta["large"], meta.get("pair_names", ""))

    def differences(self, other: PairIdentity) -> list[str]:
        """Which of the two models differ between self (the head's) and other (ours)."""
        return [role for role in ("small", "large") if getattr(self, role) != getattr(other, role)]


def head_pair(path: Path) -> PairIdentity | None:
    """The pair an our-format head file names, or None (untrained, or R2R's format)."""
    with Path(path).open("rb") as f:
        if f.read(4) == ZIP_MAGIC:
            return None  # R2R's routers name no pair; the engine checks their shapes
    try:
        header = safetensors_header(Path(path))
    except CheckpointError as exc:
        raise PolicyError(f"policy.head: {str(path)!r}: not a router head file ({exc})") from None
    meta = header.get("__metadata__") or {}
    return PairIdentity.from_metadata(meta if isinstance(meta, dict) else {})


def check_head_pair(path: Path, small_dir: Path, large_dir: Path) -> None:
    """PolicyError (`policy.head`) when the head at `path` was trained on another pair."""
    trained = head_pair(path)
    if trained is None:
        return
    ours = PairIdentity.of(small_dir, large_dir)
    differ = trained.differences(ours)
    if differ:
        which = " and ".join(
            f"the {role} model ({getattr(ours, role)[:12]} here, "
            f"{getattr(trained, role)[:12]} in the head)"
            for role in differ
        )
        raise PolicyError(
            f"policy.head: {str(path)!r}: trained for the pair {trained.names or '?'} "
            f"(pair {trained.pair[:12]}), not this config's {ours.names} (pair "
            f"{ours.pair[:12]}): {which} differ(s) in config.json or tokenizer.json; "
            "train a head for this pair (tokenrouterd train-router)"
        )
