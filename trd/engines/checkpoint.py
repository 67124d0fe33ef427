"""Reading an HF-format checkpoint directory: config.json, *.safetensors, tokenizer files.

Everything here fails with a `CheckpointError` that names the directory and the file
or field at fault, so a user who points the daemon at the wrong folder learns why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_TYPES = ("qwen3", "qwen2", "llama")
DTYPES = ("float64", "float32", "bfloat16", "float16")


class CheckpointError(ValueError):
    """A directory that is not a checkpoint this engine can serve."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The architecture facts the model code needs, normalised across families."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # bias on q/k/v projections (Qwen2 always, Llama/Qwen3 per config)
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool  # Qwen3's per-head RMSNorm on q and k
    eos_token_ids: tuple[int, ...]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path.parent}: missing {path.name}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _field(cfg: dict[str, Any], key: str, path: Path, kind: type | tuple[type, ...]) -> Any:
    if key not in cfg:
        raise CheckpointError(f"{path}: missing field {key!r}")
    value = cfg[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise CheckpointError(f"{path}: field {key!r} has unexpected value {value!r}")
    return value


def _rope_theta(cfg: dict[str, Any], path: Path) -> float:
    # transformers 5 writes rope_parameters; older checkpoints use rope_theta/rope_scaling.
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    if rope_type not in (None, "default"):
        raise CheckpointError(f"{path}: rope type {rope_type!r} is not supported (only default)")
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if not isinstance(theta, int | float) or theta <= 0:
        raise CheckpointError(f"{path}: field 'rope_theta' has unexpected value {theta!r}")
    return float(theta)


def _eos_ids(model_dir: Path, cfg: dict[str, Any]) -> tuple[int, ...]:
    gen_path = model_dir / "generation_config.json"
    gen = _read_json(gen_path) if gen_path.exists() else {}
    eos = gen.get("eos_token_id", cfg.get("eos_token_id"))
    if eos is None:
        return ()
    return (eos,) if isinstance(eos, int) else tuple(int(e) for e in eos)


def load_config(model_dir: Path) -> ModelConfig:
    """Parse and validate `model_dir/config.json` for one of the supported families."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: not a directory")
    path = model_dir / "config.json"
    cfg = _read_json(path)
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_TYPES:
        raise CheckpointError(
            f"{path}: model_type {model_type!r} is not supported (supported: {SUPPORTED_TYPES})"
        )
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{path}: hidden_act {act!r} is not supported (only silu)")
    hidden = _field(cfg, "hidden_size", path, int)
    heads = _field(cfg, "num_attention_heads", path, int)
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    if heads % kv_heads:
        raise CheckpointError(f"{path}: num_attention_heads {heads} not a multiple of {kv_heads}")
    attention_bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(
        model_type=model_type,
        vocab_size=_field(cfg, "vocab_size", path, int),
        hidden_size=hidden,
        intermediate_size=_field(cfg, "intermediate_size", path, int),
        num_layers=_field(cfg, "num_hidden_layers", path, int),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(cfg, path),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=model_type != "qwen2" and attention_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        eos_token_ids=_eos_ids(model_dir, cfg),
    )


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files of a checkpoint (single file or shards), sorted."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{model_dir}: no *.safetensors weight files")
    return files
