"""Every built-in policy's parameters, declared once and checked without torch.

The config reader checks `policy:` here at start (and `tokenrouterd --check`), so a
typo or an out-of-range value is refused with its key before any engine loads; the
engines build their policy from the same checked object. A policy with a threshold
(THRESHOLDS) also takes one of two shares, read above the policy, which never sees them:
`target_large_share`, which the daemon's share control holds over all traffic by moving
the threshold (trd/supervisor/share.py), or `request_large_share`, which every request
that brings no `routing` of its own holds within itself, as if it had sent
`routing.large_share` (trd/policies/budget.py; trd/frontend/routing.py).
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


GLIMP_MAX_H = math.log(20)  # the entropy of a uniform top-20 distribution, in nats


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
    # Router file read by the entry engine: our head (.safetensors, trd/policies/heads.py)
    # or, for r2r, a router R2R publishes (torch.save, trd/policies/r2r_file.py).
    head: str = ""
    threshold: float | None = None  # None: the threshold stored in the head file

    def check(self, num_models: int) -> GatedParams:
        if num_models < 2:
            raise _fail("name", "gated", "needs at least two models")
        if not isinstance(self.head, str) or not Path(self.head).is_file():
            raise _fail("head", self.head, "expected the path of a router head file")
        tau = None if self.threshold is None else _fraction("threshold", self.threshold)
        return GatedParams(self.head, tau)


@dataclass(frozen=True, slots=True)
class GlimpParams:
    threshold: float = 1.0  # nats: top-20 entropy of a step's first token at or above it
    step_tokens: int = 512  # a step without a blank line ends after this many tokens
    think_end: str | None = None  # None: "</think>" if the tokenizer has it

    def check(self, num_models: int) -> GlimpParams:
        if num_models < 2:
            raise _fail("name", "glimp", "needs at least two models")
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t <= GLIMP_MAX_H:
            raise _fail("threshold", t, f"expected a number in [0, ln 20 = {GLIMP_MAX_H:.4f}]")
        n = self.step_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise _fail("step_tokens", n, "expected an integer >= 1")
        end = self.think_end
        if end is not None and (not isinstance(end, str) or not end):
            raise _fail("think_end", self.think_end, "expected the text of one token")
        return GlimpParams(float(t), n, self.think_end)


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


Params = RStitchParams | GatedParams | GlimpParams | ScriptedParams | EnsembleParams
PARAMS: dict[str, type[Params]] = {
    "rstitch": RStitchParams,
    "citer": GatedParams,
    "r2r": GatedParams,
    "collm": GatedParams,
    "glimp": GlimpParams,
    "ensemble": EnsembleParams,
    "scripted": ScriptedParams,
}


@dataclass(frozen=True, slots=True)
class ThresholdScale:
    """Where a policy's threshold lives and which way it moves the large model's share."""

    low: float
    high: float
    raises_share: bool  # a higher threshold sends more tokens to the large model


# The policies with a threshold, which `target_large_share` can steer.
THRESHOLDS = {
    "rstitch": ThresholdScale(0.0, 1.0, False),  # escalate when entropy > tau
    "citer": ThresholdScale(0.0, 1.0, True),  # escalate when confidence < tau
    "r2r": ThresholdScale(0.0, 1.0, False),  # escalate when divergence >= tau
    "collm": ThresholdScale(0.0, 1.0, False),  # escalate when deferral > tau
    "glimp": ThresholdScale(0.0, GLIMP_MAX_H, False),  # large writes when entropy >= tau
}
TARGET_KEY = "target_large_share"
REQUEST_KEY = "request_large_share"
SHARE_KEYS = (TARGET_KEY, REQUEST_KEY)
MODEL_KEY = "request_model"  # every policy: the model of each request without routing


def parse_policy(name: str, raw: dict[str, Any], num_models: int) -> Params:
    """The checked parameters of policy `name`; PolicyError names the bad key."""
    if name not in PARAMS:
        raise _fail("name", name, f"unknown policy (choose from {sorted(PARAMS)})")
    cls = PARAMS[name]
    known = {f.name for f in fields(cls)} | (set(SHARE_KEYS) if name in THRESHOLDS else set())
    known.add(MODEL_KEY)
    for key in raw:
        if key not in known:
            raise _fail(str(key), raw[key], f"unknown parameter of {name} (known: {sorted(known)})")
    spec = PolicySpec(name, raw)
    shares = target_share(spec), request_share(spec)  # each checked
    if None not in shares:
        why = f"give it or {TARGET_KEY}, not both (a request's own share replaces the threshold"
        raise _fail(REQUEST_KEY, raw[REQUEST_KEY], why + " the share control moves)")
    if MODEL_KEY in raw and (shares[1] is not None or not isinstance(raw[MODEL_KEY], str)):
        why = f"a served model's name, without {REQUEST_KEY} (each is a request's default)"
        raise _fail(MODEL_KEY, raw[MODEL_KEY], why)
    own = {k: v for k, v in raw.items() if k not in (*SHARE_KEYS, MODEL_KEY)}
    return cls(**own).check(num_models)


def request_model(spec: PolicySpec) -> str | None:
    """The model that writes every token of a request without `routing`, if named."""
    value = spec.params.get(MODEL_KEY)
    return None if value is None else str(value)


def target_share(spec: PolicySpec) -> float | None:
    """The large model's share of committed tokens the daemon holds, if asked (else None)."""
    return _share(spec, TARGET_KEY)


def request_share(spec: PolicySpec) -> float | None:
    """The large model's share each request without `routing` holds within itself, if
    asked (else None)."""
    return _share(spec, REQUEST_KEY)


def _share(spec: PolicySpec, key: str) -> float | None:
    value = spec.params.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise _fail(key, value, "expected a number strictly between 0 and 1")
    return float(value)
