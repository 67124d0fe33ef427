"""Every built-in policy's parameters, declared once and checked without torch.

The config reader checks `policy:` here at start (and `tokenrouterd --check`), so a
typo or an out-of-range value is refused with its key before any engine loads; the
engines build their policy from the same checked object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A policy's name and its raw parameters, as the config gives them."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


class PolicyError(ValueError):
    """A policy parameter that cannot work; the message is `policy.key: value: reason`."""


def _fail(key: str, value: Any, reason: str) -> PolicyError:
    return PolicyError(f"policy.{key}: {value!r}: {reason}")


def _fraction(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise _fail(key, value, "expected a number in [0, 1]")
    return float(value)


@dataclass(frozen=True, slots=True)
class RStitchParams:
    threshold: float = 0.3  # normalised entropy above which the next model takes over

    def check(self, num_models: int) -> RStitchParams:
        return RStitchParams(_fraction("threshold", self.threshold))


@dataclass(frozen=True, slots=True)
class GatedParams:
    head: str = ""  # router head file (safetensors), read by the entry engine
    threshold: float = 0.5

    def check(self, num_models: int) -> GatedParams:
        if num_models < 2:
            raise _fail("name", "gated", "needs at least two models")
        if not isinstance(self.head, str) or not Path(self.head).is_file():
            raise _fail("head", self.head, "expected the path of a router head file")
        return GatedParams(self.head, _fraction("threshold", self.threshold))


@dataclass(frozen=True, slots=True)
class ScriptedParams:
    schedule: tuple[int, ...] = (0,)  # owner of output position p: schedule[p % len]

    def check(self, num_models: int) -> ScriptedParams:
        s = self.schedule

        def index(i: Any) -> bool:
            return isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_models

        if not isinstance(s, list | tuple) or not s or not all(map(index, s)):
            raise _fail("schedule", s, f"expected a non-empty list of model indices < {num_models}")
        return ScriptedParams(tuple(s))


@dataclass(frozen=True, slots=True)
class EnsembleParams:
    weights: tuple[float, ...] = ()  # one per model; normalised
    seed: int = 0

    def check(self, num_models: int) -> EnsembleParams:
        w = self.weights
        ok = (
            isinstance(w, list | tuple)
            and len(w) == num_models
            and all(
                isinstance(x, int | float)
                and not isinstance(x, bool)
                and math.isfinite(x)
                and x >= 0
                for x in w
            )
        )
        if not ok or sum(w) <= 0:
            raise _fail("weights", w, f"expected {num_models} non-negative numbers, sum > 0")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise _fail("seed", self.seed, "expected an integer >= 0")
        total = float(sum(w))
        return EnsembleParams(tuple(float(x) / total for x in w), self.seed)


Params = RStitchParams | GatedParams | ScriptedParams | EnsembleParams
PARAMS: dict[str, type[Params]] = {
    "rstitch": RStitchParams,
    "citer": GatedParams,
    "r2r": GatedParams,
    "collm": GatedParams,
    "ensemble": EnsembleParams,
    "scripted": ScriptedParams,
}


def parse_policy(name: str, raw: dict[str, Any], num_models: int) -> Params:
    """The checked parameters of policy `name`; PolicyError names the bad key."""
    if name not in PARAMS:
        raise _fail("name", name, f"unknown policy (choose from {sorted(PARAMS)})")
    cls = PARAMS[name]
    known = {f.name for f in fields(cls)}
    for key in raw:
        if key not in known:
            raise _fail(str(key), raw[key], f"unknown parameter of {name} (known: {sorted(known)})")
    return cls(**raw).check(num_models)
