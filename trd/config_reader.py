"""Reading one mapping of a config with typed getters that name the key on every error.

sec = Section("engine", raw["engine"])
page_size = sec.integer("page_size", 16, low=1)
sec.done()          # any key nobody asked for is an error: "engine.pag_size: ..."
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

_MISSING: Any = object()


class ConfigError(ValueError):
    """A bad config value; the message is `key: value: reason`."""


def fail(key: str, value: Any, reason: str) -> NoReturn:
    raise ConfigError(f"{key}: {value!r}: {reason}")


class Section:
    """A mapping at `key` (dotted path; "config" for the top level)."""

    def __init__(self, key: str, data: Any) -> None:
        # `memory:` with nothing after it parses as None; read it as an empty mapping.
        data = {} if data is None else data
        if not isinstance(data, dict):
            fail(key, data, "expected a mapping")
        self.key = key
        self.data: dict[Any, Any] = data
        self.asked: set[str] = set()

    def path(self, name: str) -> str:
        return name if self.key == "config" else f"{self.key}.{name}"

    def get(self, name: str, default: Any = _MISSING) -> Any:
        self.asked.add(name)
        if name in self.data:
            return self.data[name]
        if default is _MISSING:
            raise ConfigError(f"{self.path(name)}: missing (required)")
        return default

    def keys(self) -> list[Any]:
        return list(self.data)

    def string(self, name: str, default: Any = _MISSING) -> str:
        value = self.get(name, default)
        if not isinstance(value, str) or not value:
            fail(self.path(name), value, "expected a non-empty string")
        return value

    def integer(self, name: str, default: Any = _MISSING, low: int | None = None) -> int:
        value = self.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int):
            fail(self.path(name), value, "expected an integer")
        if low is not None and value < low:
            fail(self.path(name), value, f"must be >= {low}")
        return value

    def boolean(self, name: str, default: Any = _MISSING) -> bool:
        value = self.get(name, default)
        if not isinstance(value, bool):
            fail(self.path(name), value, "expected true or false")
        return value

    def number(
        self,
        name: str,
        default: Any = _MISSING,
        low: float | None = None,
        high: float | None = None,
    ) -> float:
        value = self.get(name, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            fail(self.path(name), value, "expected a number")
        if low is not None and value < low:
            fail(self.path(name), value, f"must be >= {low:g}")
        if high is not None and value > high:
            fail(self.path(name), value, f"must be <= {high:g}")
        return float(value)

    def choice(self, name: str, options: list[str], default: Any = _MISSING) -> str:
        value = self.get(name, default)
        if value not in options:
            fail(self.path(name), value, f"expected one of {options}")
        return str(value)

    def list(self, name: str, default: Any = _MISSING) -> list[Any]:
        value = self.get(name, default)
        if not isinstance(value, list):
            fail(self.path(name), value, "expected a list")
        return value

    def rest(self) -> dict[str, Any]:
        """Every key not asked for yet (e.g. a policy's own parameters), now accepted."""
        out = {k: v for k, v in self.data.items() if k not in self.asked}
        self.asked.update(str(k) for k in out)
        return out

    def done(self) -> None:
        """Reject the first key nobody asked for."""
        for k, v in self.data.items():
            if k not in self.asked:
                fail(self.path(str(k)), v, f"unknown key (known: {sorted(self.asked)})")
