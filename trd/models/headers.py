"""safetensors headers: `| u64 little-endian N | N bytes of JSON |`, each tensor's dtype,
shape and byte range, read without the data (a 32B checkpoint in milliseconds)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from trd.models.errors import CheckpointError


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor entries and `__metadata__`)."""
    try:
        with path.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file (no header length)")
            (length,) = struct.unpack("<Q", prefix)
            raw = f.read(min(length, 1 << 30))
    except OSError as exc:  # unreadable by the user the daemon runs as, say
        raise CheckpointError(f"{path}: cannot read it ({exc.strerror})") from None
    if len(raw) < length:
        raise CheckpointError(
            f"{path}: truncated safetensors header ({len(raw)} of {length} bytes present)"
        )
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header is not a JSON object")
    return header


def tensor_infos(path: Path) -> list[tuple[str, str, list[int]]]:
    """(name, safetensors dtype, shape) of each tensor a safetensors file's header lists."""
    out = []
    for name, info in safetensors_header(path).items():
        if name == "__metadata__":
            continue
        shape = info.get("shape") if isinstance(info, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            raise CheckpointError(f"{path}: tensor {name!r} has no valid shape")
        out.append((name, str(info.get("dtype")), shape))
    return out
