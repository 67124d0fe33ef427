"""The one reader of HF-format checkpoint directories: config.json, safetensors headers.

    model_dir/
      config.json               architecture (Qwen3, Qwen2, Llama families)
      generation_config.json    eos ids (optional; config.json's are the fallback)
      *.safetensors             weights, one file or shards; only the headers are read here
      tokenizer.json ...        its vocabulary size is read here (`vocab_limit`); the front
                                end encodes with it, `tokenizers.py` compares routed models'

Headers only (`headers.py`): a 32B checkpoint is read in milliseconds. The supervisor
reads every checkpoint once at start; the result goes to the memory plan and, pickled
inside each engine's spec, to the engine that loads it. A quantised checkpoint
(`quantization.py`) says so in config.json; its weight bytes are counted as stored.
Every failure is a `CheckpointError` naming the directory and the file or field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trd.models import quantization as qmodes
from trd.models.errors import CheckpointError
from trd.models.headers import safetensors_header, tensor_infos
from trd.models.rope import RopeConfig, read_rope
from trd.models.tokenizers import read_tokenizer

SUPPORTED_TYPES = ("qwen3", "qwen2", "llama")
# transformers' defaults where config.json omits max_position_embeddings (dynamic rope
# scales from it, so a different default would change the frequencies).
DEFAULT_CONTEXT = {"qwen3": 32768, "qwen2": 32768, "llama": 2048}
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
DTYPES = tuple(DTYPE_BYTES)
# safetensors dtypes of quantised tensors (trd/models/qformat.py) and their sizes.
_STORED_BYTES = {"U8": 1, "I8": 1, "F16": 2}

__all__ = [
    "DTYPES",
    "Checkpoint",
    "CheckpointError",
    "ModelConfig",
    "read_checkpoint",
    "safetensors_header",
]


def dtype_size(dtype: str) -> int:
    """Bytes per element of a serving dtype such as "bfloat16"."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} is not supported (choose from {DTYPES})") from None


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The architecture facts the model code and the memory plan need, normalised."""

    model_type: str
    vocab_size: int  # rows of the embedding matrix (may exceed the tokenizer's vocabulary)
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    context: int  # longest sequence served: max_position_embeddings, as the rope variant extends it
    tie_word_embeddings: bool
    qkv_bias: bool  # bias on q/k/v projections (Qwen2 always, Llama/Qwen3 per config)
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool  # Qwen3's per-head RMSNorm on q and k
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_dict(
        cls, cfg: dict[str, Any], source: str, eos: tuple[int, ...] | None = None
    ) -> ModelConfig:
        """Validate a parsed config.json; `source` names it in errors."""
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_TYPES:
            raise CheckpointError(
                f"{source}: model_type {model_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_TYPES)})"
            )
        layers = _positive(cfg, "num_hidden_layers", source)
        _refuse_unimplemented(cfg, layers, source)
        hidden = _positive(cfg, "hidden_size", source)
        heads = _positive(cfg, "num_attention_heads", source)
        kv_heads = _optional_positive(cfg, "num_key_value_heads", source) or heads
        # transformers' Qwen3Config defaults head_dim to 128, the others derive it.
        derived = 128 if model_type == "qwen3" else hidden // heads
        head_dim = _optional_positive(cfg, "head_dim", source) or derived
        if heads % kv_heads:
            raise CheckpointError(
                f"{source}: num_attention_heads {heads} is not a multiple of "
                f"num_key_value_heads {kv_heads}"
            )
        if head_dim % 2:
            raise CheckpointError(f"{source}: head_dim {head_dim} is odd; rope needs pairs")
        attention_bias = bool(cfg.get("attention_bias", False))
        context = (_optional_positive(cfg, "max_position_embeddings", source)
                   or DEFAULT_CONTEXT[model_type])  # fmt: skip
        rope = read_rope(cfg, context, source)
        return cls(
            model_type=model_type,
            vocab_size=_positive(cfg, "vocab_size", source),
            hidden_size=hidden,
            intermediate_size=_positive(cfg, "intermediate_size", source),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_number(cfg, "rms_norm_eps", 1e-6, source),
            rope=rope,
            context=rope.context(context),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or attention_bias,
            o_bias=model_type != "qwen2" and attention_bias,
            mlp_bias=model_type == "llama" and bool(cfg.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            eos_token_ids=_eos_ids(cfg.get("eos_token_id")) if eos is None else eos,
        )

    def kv_bytes_per_token(self, dtype: str) -> int:
        """A K and a V vector per layer and KV head."""
        return self.num_layers * self.num_kv_heads * self.head_dim * 2 * dtype_size(dtype)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint directory, read and validated once."""

    path: Path
    config: ModelConfig
    weight_files: tuple[Path, ...]
    num_params: int  # elements of every tensor in the weight files
    # Token ids that exist: the tokenizer's largest id + 1 (added tokens included), or
    # vocab_size without a tokenizer.json. Rows of the embedding matrix past it are
    # padding (Qwen pads 151665 ids to 151936 or 152064 rows); they are never sampled.
    vocab_limit: int
    # "none", or the mode of a quantised checkpoint (config.json's trd_quantization).
    quantization: str = "none"
    quantized_params: int = 0  # elements of its quantised tensors (qweight, scales, mins)
    quantized_bytes: int = 0  # and their bytes as stored (served as stored)
    # (name, rows, cols, bits) of each matrix a mode quantises: bits 4 or 8 as stored,
    # 0 in a float checkpoint.
    matrices: tuple[tuple[str, int, int, int], ...] = ()
    dense_params: int = 0  # quantised checkpoints: elements once dequantised

    def unquantized_bytes(self, dtype: str) -> int:
        """Weight bytes of the model with every matrix dequantised to `dtype`."""
        return (self.dense_params or self.num_params) * dtype_size(dtype)

    def weight_bytes(self, dtype: str, quantization: str = "none") -> int:
        """Resident weight bytes: float tensors cast to `dtype`; quantised ones as stored,
        or for a float checkpoint served with `quantization`, as that mode stores them."""
        size = dtype_size(dtype)
        if self.quantization != "none":
            return self.quantized_bytes + (self.num_params - self.quantized_params) * size
        total = self.num_params * size
        if quantization != "none":
            for name, rows, cols, _ in self.matrices:
                bits = qmodes.bits_for(name, quantization)
                total += qmodes.quantised_bytes(rows, cols, bits) - rows * cols * size
        return total


def read_checkpoint(model_dir: Path | str) -> Checkpoint:
    """Parse config.json (+ generation_config.json) and every safetensors header."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: not a directory")
    config_path = model_dir / "config.json"
    raw = _read_json(config_path)
    gen_path = model_dir / "generation_config.json"
    eos = _eos_ids(_read_json(gen_path).get("eos_token_id")) if gen_path.exists() else None
    config = ModelConfig.from_dict(raw, str(config_path), eos or None)
    try:
        mode = qmodes.read_marker(raw, str(config_path))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    files = tuple(sorted(model_dir.glob("*.safetensors")))
    if not files:
        raise CheckpointError(f"{model_dir}: no *.safetensors weight files")
    tensors = [t for path in files for t in tensor_infos(path)]
    params = sum(math.prod(shape) for _, _, shape in tensors)
    stored = [(dtype, shape) for name, dtype, shape in tensors
              if name.rsplit(".", 1)[-1] in ("qweight", "scales", "mins")]  # fmt: skip
    # A 4-bit qweight (uint8) holds two weights a byte, an 8-bit one (int8) one.
    dense = sum(math.prod(shape) * (2 if dtype == "U8" else 1) for name, dtype, shape in tensors
                if name.endswith(".qweight"))  # fmt: skip
    if mode == "none" and stored:
        raise CheckpointError(f"{config_path}: quantised tensors but no {qmodes.KEY}")
    matrices = tuple(
        (name.removesuffix(".weight"), shape[0], shape[1], 0)
        for name, _, shape in tensors
        if len(shape) == 2 and qmodes.quantised_name(name.removesuffix(".weight"))
    ) + tuple(
        (name.removesuffix(".qweight"), shape[0], shape[1] * (2 if dtype == "U8" else 1),
         4 if dtype == "U8" else 8)
        for name, dtype, shape in tensors
        if name.endswith(".qweight") and len(shape) == 2
    )  # fmt: skip
    return Checkpoint(
        model_dir, config, files, params, _vocab_limit(model_dir, config), mode,
        quantized_params=sum(math.prod(shape) for _, shape in stored),
        quantized_bytes=sum(math.prod(shape) * _STORED_BYTES.get(d, 4) for d, shape in stored),
        matrices=matrices,
        dense_params=dense + params - sum(math.prod(shape) for _, shape in stored) if dense else 0,
    )  # fmt: skip


def _vocab_limit(model_dir: Path, config: ModelConfig) -> int:
    tokenizer = read_tokenizer(model_dir)
    if tokenizer is None:
        return config.vocab_size
    limit = tokenizer.vocab_limit
    if limit > config.vocab_size:
        raise CheckpointError(
            f"{tokenizer.path}: token ids reach {limit - 1}, but config.json's vocab_size "
            f"is {config.vocab_size}: the model has no embedding for them"
        )
    return limit


def _refuse_unimplemented(cfg: dict[str, Any], layers: int, source: str) -> None:
    """Config keys that change the computation in ways the model code does not implement."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{source}: hidden_act {act!r} is not supported (only silu)")
    layer_types = cfg.get("layer_types")
    if layer_types:  # transformers follows these when given, else derives them as below
        listed = layer_types if isinstance(layer_types, list) else [layer_types]
        other = [t for t in listed if t != "full_attention"]
        if other:
            raise CheckpointError(
                f"{source}: layer_types {other[0]!r} is not supported (only full_attention)"
            )
    elif (
        cfg.get("model_type") in ("qwen2", "qwen3")
        and cfg.get("use_sliding_window")
        and cfg.get("sliding_window", 4096) is not None
        and (_optional_positive(cfg, "max_window_layers", source) or 28) < layers
    ):
        raise CheckpointError(
            f"{source}: use_sliding_window true is not supported (layers from "
            f"max_window_layers {cfg.get('max_window_layers', 28)} on would use a window)"
        )
    if cfg.get("quantization_config"):
        raise CheckpointError(
            f"{source}: quantization_config: quantized weights are not supported "
            "(use an unquantized checkpoint with models[].quantization, or import a GGUF "
            "with `tokenrouterd import-gguf --quantization int4`)"
        )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path.parent}: missing {path.name}") from None
    except OSError as exc:  # unreadable by the user the daemon runs as, say
        raise CheckpointError(f"{path}: cannot read it ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _positive(cfg: dict[str, Any], key: str, source: str) -> int:
    if key not in cfg:
        raise CheckpointError(f"{source}: missing field {key!r}")
    value = _optional_positive(cfg, key, source)
    assert value is not None
    return value


def _optional_positive(cfg: dict[str, Any], key: str, source: str) -> int | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{source}: field {key!r} has unexpected value {value!r}")
    return value


def _number(cfg: dict[str, Any], key: str, default: float, source: str) -> float:
    value = cfg.get(key, default)
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value <= 0:
        raise CheckpointError(f"{source}: field {key!r} has unexpected value {value!r}")
    return float(value)


def _eos_ids(eos: Any) -> tuple[int, ...]:
    if eos is None:
        return ()
    return (int(eos),) if isinstance(eos, int) else tuple(int(e) for e in eos)
