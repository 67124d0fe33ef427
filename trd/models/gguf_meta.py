"""Opening a GGUF file and reading its metadata, with errors that name the file and key.

A GGUF file is a header of typed key/value metadata (`general.architecture`,
`llama.block_count`, `tokenizer.ggml.tokens`, ...) followed by tensors; `gguf.GGUFReader`
memory-maps it and parses both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType


class GGUFImportError(ValueError):
    """A GGUF file this importer cannot turn into a checkpoint; the message says why."""


_MISSING: Any = object()


class GGUFMeta:
    """Typed access to one file's metadata; a missing or mistyped key is a GGUFImportError."""

    def __init__(self, src: Path) -> None:
        self.src = Path(src)
        if not self.src.is_file():
            raise GGUFImportError(f"{self.src}: no such file")
        try:
            self.reader = GGUFReader(self.src)
        except (ValueError, OSError, IndexError, KeyError) as exc:
            # Bad magic, an empty file, or a header cut short all land here.
            raise GGUFImportError(f"{self.src}: not a readable GGUF file ({exc})") from None
        self.arch = str(self.get("general.architecture", str))

    def has(self, key: str) -> bool:
        return key in self.reader.fields

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
        field = self.reader.fields.get(key)
        if field is None:
            if default is not _MISSING:
                return default
            arch = getattr(self, "arch", "?")
            raise GGUFImportError(f"{self.src}: missing metadata key {key!r} (architecture {arch})")
        value = field.contents()
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            shown = repr(value)[:80]  # an array of per-layer values can be long
            raise GGUFImportError(f"{self.src}: metadata key {key!r} has unexpected value {shown}")
        return value

    def arch_int(self, key: str, default: Any = _MISSING) -> int:
        """An integer hyperparameter stored under the architecture's prefix (`llama.<key>`)."""
        return int(self.get(f"{self.arch}.{key}", int, default))

    def arch_float(self, key: str, default: Any = _MISSING) -> float:
        full = f"{self.arch}.{key}"
        value = float(self.get(full, (int, float), default))
        if self.has(full) and self.reader.fields[full].types == [GGUFValueType.FLOAT32]:
            # The converter was given the shortest decimal that rounds to this float32
            # (1e-05, not 9.99999974e-06); write that back.
            value = float(str(np.float32(value)))
        return value
