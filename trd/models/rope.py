"""Rotary position embedding settings as a checkpoint's config.json states them.

transformers 5 writes `rope_parameters: {rope_type, rope_theta, ...}`; older checkpoints
write `rope_theta` and `rope_scaling: {type | rope_type, factor, ...}`. Both read into
one `RopeConfig`, with transformers' precedence (a non-empty `rope_scaling` wins) and
defaults, so that the frequencies `trd/models/rotary.py` computes from it are the ones
transformers computes. A variant, key or value the model code does not implement is
refused by name; nothing is silently ignored.

    variant   what it scales                                  served context
    default   -                                               max_position_embeddings
    linear    every frequency / factor                        max_position_embeddings
    llama3    low frequencies / factor, a smooth band between max_position_embeddings
    yarn      like llama3 by rotation counts, plus cos/sin    max(max_position_embeddings,
              scaled by an attention factor (mscale)          original x factor)
    dynamic   the base, by the length of the sequence at      max_position_embeddings
              each forward once it exceeds the original       x factor
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trd.models.errors import CheckpointError

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
DEFAULT_THETA = 10000.0  # transformers' default_theta for these model families

# The keys each variant reads (besides rope_type / type / rope_theta); others are refused.
_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
             "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}  # fmt: skip
_REQUIRED = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor")}  # fmt: skip
_COMMON = ("rope_type", "type", "rope_theta", "partial_rotary_factor")


@dataclass(frozen=True, slots=True)
class RopeConfig:
    rope_type: str = "default"
    theta: float = DEFAULT_THETA
    factor: float = 1.0
    # The length the variant scales from: llama3 and yarn's original_max_position_embeddings,
    # dynamic's max_position_embeddings (its frequencies change past it); else 0.
    original_context: int = 0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: round the correction range outwards
    attention_factor: float | None = None  # yarn: None = from factor (and mscale)
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn

    def context(self, max_position_embeddings: int) -> int:
        """The longest sequence a model with these settings serves."""
        if self.rope_type == "dynamic":
            return int(max_position_embeddings * self.factor)
        if self.rope_type == "yarn":
            return max(max_position_embeddings, int(self.original_context * self.factor))
        return max_position_embeddings


def read_rope(cfg: dict[str, Any], context: int, source: str) -> RopeConfig:
    """The rope settings of a parsed config.json; `source` names it in errors.

    `context` is the config's max_position_embeddings (what transformers falls back to
    when a variant's original length is not given)."""
    key, raw = _rope_dict(cfg, source)
    rope_type = raw.get("rope_type") or raw.get("type") or "default"
    _check_keys(cfg, key, raw, rope_type, source)
    theta_key = f"{key}.rope_theta" if "rope_theta" in raw else "rope_theta"
    theta = raw.get("rope_theta", cfg.get("rope_theta"))
    fields: dict[str, Any] = {
        "rope_type": rope_type,
        "theta": _number(theta, theta_key, source, default=DEFAULT_THETA),
    }
    if rope_type == "default":
        return RopeConfig(**fields)
    original = context if rope_type == "dynamic" else 0  # linear scales every position
    if rope_type in ("llama3", "yarn"):
        original = _original(cfg, key, raw, context, source)
    factor = raw["factor"]
    if rope_type == "yarn" and factor is None:
        factor = context / original  # transformers: the ratio of the two lengths
    fields["factor"] = _number(factor, f"{key}.factor", source, low=1.0)
    fields["original_context"] = original
    if rope_type == "llama3":
        for name in ("low_freq_factor", "high_freq_factor"):
            fields[name] = _number(raw[name], f"{key}.{name}", source)
        if fields["high_freq_factor"] <= fields["low_freq_factor"]:
            raise CheckpointError(f"{source}: {key}.high_freq_factor must exceed low_freq_factor")
    if rope_type == "yarn":
        fields |= _yarn_fields(key, raw, source)
    return RopeConfig(**fields)


def _check_keys(
    cfg: dict[str, Any], key: str, raw: dict[str, Any], rope_type: str, source: str
) -> None:
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(
            f"{source}: {key}.rope_type {rope_type!r} is not supported "
            f"(supported: {', '.join(ROPE_TYPES)})"
        )
    for name in raw:
        if name not in _COMMON and name not in _KEYS[rope_type]:
            raise CheckpointError(
                f"{source}: {key}.{name} is not supported for rope type {rope_type!r}"
            )
    for name in _REQUIRED.get(rope_type, ()):
        if name not in raw:
            raise CheckpointError(f"{source}: {key}.{name} is missing (rope type {rope_type!r})")
    inside = "partial_rotary_factor" in raw
    partial = raw["partial_rotary_factor"] if inside else cfg.get("partial_rotary_factor")
    if partial is not None and partial != 1:
        where = f"{key}.partial_rotary_factor" if inside else "partial_rotary_factor"
        raise CheckpointError(f"{source}: {where} {partial!r} is not supported (only 1.0)")


def _yarn_fields(key: str, raw: dict[str, Any], source: str) -> dict[str, Any]:
    # `or`: transformers treats a 0 or null beta as unset.
    fields: dict[str, Any] = {
        "beta_fast": _number(raw.get("beta_fast") or 32, f"{key}.beta_fast", source),
        "beta_slow": _number(raw.get("beta_slow") or 1, f"{key}.beta_slow", source),
    }
    truncate = raw.get("truncate", True)
    if not isinstance(truncate, bool):
        raise CheckpointError(f"{source}: {key}.truncate {truncate!r}: expected true or false")
    fields["truncate"] = truncate
    for name in ("attention_factor", "mscale", "mscale_all_dim"):
        if raw.get(name) is not None:
            fields[name] = _number(raw[name], f"{key}.{name}", source)
    return fields


def _rope_dict(cfg: dict[str, Any], source: str) -> tuple[str, dict[str, Any]]:
    """transformers' precedence: a non-empty rope_scaling, else rope_parameters."""
    for key in ("rope_scaling", "rope_parameters"):
        raw = cfg.get(key)
        if raw is None or raw == {}:
            continue
        if not isinstance(raw, dict):
            raise CheckpointError(f"{source}: {key} must be a JSON object, got {raw!r}")
        nested = [k for k, v in raw.items() if isinstance(v, dict)]
        if nested:
            raise CheckpointError(
                f"{source}: {key}.{nested[0]}: per-layer-type rope settings are not supported"
            )
        return key, raw
    return "rope_parameters", {}


def _original(cfg: dict[str, Any], key: str, raw: dict[str, Any], context: int, source: str) -> int:
    # transformers lets a top-level original_max_position_embeddings override the dict's.
    if "original_max_position_embeddings" in cfg:
        value, where = cfg["original_max_position_embeddings"], "original_max_position_embeddings"
    else:
        where = f"{key}.original_max_position_embeddings"
        value = raw.get("original_max_position_embeddings", context)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{source}: {where} has unexpected value {value!r}")
    return value


def _number(
    value: Any, key: str, source: str, default: float | None = None, low: float = 0.0
) -> float:
    if value is None and default is not None:
        return default
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value <= 0 or value < low:
        bound = f">= {low:g}" if low else "> 0"
        raise CheckpointError(f"{source}: {key} has unexpected value {value!r} (expected {bound})")
    return float(value)
