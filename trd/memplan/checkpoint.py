"""What a checkpoint costs in memory, read from config.json and safetensors headers.

Only the headers are read, never the tensors, so planning a 32B model takes
milliseconds. A safetensors file starts like this:

    | u64 little-endian N | N bytes of JSON header | tensor data ... |

    header = {"__metadata__": {...},                       # optional, skipped
              "<tensor name>": {"dtype": "BF16", "shape": [5120, 25600],
                                "data_offsets": [begin, end]}, ...}
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bytes per element of the dtypes an engine can serve in.
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}


class CheckpointError(ValueError):
    """A model directory that cannot be planned for; the message names the path."""


def dtype_size(dtype: str) -> int:
    """Bytes per element of a serving dtype name such as "bfloat16"."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(
            f"unknown dtype {dtype!r}; expected one of {sorted(DTYPE_BYTES)}"
        ) from None


@dataclass(frozen=True)
class ModelShape:
    """The dimensions that decide a model's weight, KV and activation memory."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_params: int

    @classmethod
    def from_config(cls, config: dict[str, Any], num_params: int, source: str) -> ModelShape:
        """Shape from a Qwen3/Qwen2/Llama-style config dict; `source` names it in errors."""

        def need(key: str) -> int:
            if key not in config:
                raise CheckpointError(f"{source}: missing required key {key!r}")
            return int(config[key])

        hidden = need("hidden_size")
        heads = need("num_attention_heads")
        # Models without grouped-query attention omit num_key_value_heads, and
        # most derive head_dim; Qwen3 sets head_dim explicitly (128 != 1024 // 16).
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        return cls(
            num_layers=need("num_hidden_layers"),
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            vocab_size=need("vocab_size"),
            num_params=num_params,
        )

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelShape:
        """Shape of the checkpoint in `model_dir` (config.json + safetensors headers)."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise CheckpointError(f"{model_dir}: not a checkpoint, no config.json")
        try:
            config = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path}: invalid JSON ({exc})") from None
        if not isinstance(config, dict):
            raise CheckpointError(f"{path}: expected a JSON object")
        return cls.from_config(config, read_weight_params(model_dir), str(path))


def _safetensors_files(model_dir: Path) -> list[Path]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_dir}: not a checkpoint, no *.safetensors file")
    return files


def _read_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file (no header length)")
        (length,) = struct.unpack("<Q", prefix)
        raw = f.read(length)
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


def read_weight_params(model_dir: Path) -> int:
    """Total element count of every tensor in the `*.safetensors` files of `model_dir`."""
    total = 0
    for path in _safetensors_files(model_dir):
        for name, info in _read_header(path).items():
            if name == "__metadata__":
                continue
            shape = info.get("shape") if isinstance(info, dict) else None
            if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
                raise CheckpointError(f"{path}: tensor {name!r} has no valid shape")
            total += math.prod(shape)
    return total


def weight_bytes(model_dir: Path, dtype: str) -> int:
    """Resident weight bytes once the engine has cast every tensor to `dtype`."""
    return read_weight_params(model_dir) * dtype_size(dtype)
