"""Rotary position embedding settings as a checkpoint's config.json states them.

transformers 5 writes `rope_parameters: {rope_type, rope_theta, ...}`; older checkpoints
write `rope_theta` and `rope_scaling: {type | rope_type, factor, ...}`. Both read into
one `RopeConfig`; a variant the model code does not implement is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trd.models.errors import CheckpointError

SUPPORTED_ROPE_TYPES = ("default",)


@dataclass(frozen=True, slots=True)
class RopeConfig:
    rope_type: str
    theta: float


def read_rope(cfg: dict[str, Any], head_dim: int, context: int, source: str) -> RopeConfig:
    """The rope settings of a parsed config.json; `source` names it in errors."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise CheckpointError(f"{source}: rope_parameters / rope_scaling must be JSON objects")
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    rope_type = rope_type or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(
            f"{source}: rope type {rope_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, int | float) or theta <= 0:
        raise CheckpointError(f"{source}: field 'rope_theta' has unexpected value {theta!r}")
    return RopeConfig(rope_type, float(theta))
