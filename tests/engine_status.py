"""Engine stats through the admin API (`GET /stats/raw`) that are known to be fresh.

Engines send their stats every half second (trd/engines/loop.py), so a status read just
after an event may describe the engines before it: idle pages from before a request
began, a counter that has not moved yet. Each engine stamps its stats with the wall
clock (`time`); these helpers wait for stats stamped after a moment the test chose, as the
launcher's `Daemon.fresh_stats` does, and for a condition on them, or for some engines only
(a stopped engine sends none).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

Engines = list[dict[str, Any]]


class HasAdmin(Protocol):
    config: dict[str, Any]

    def admin_call(self, method: str, path: str, body: Any = None) -> Any: ...


def raw_stats(d: HasAdmin) -> Engines:
    """Each live engine's latest stats, in model order."""
    return sorted(d.admin_call("GET", "/stats/raw").values(), key=lambda e: int(e["model"]))


def fresh_engines(
    d: HasAdmin, since: float, until: Callable[[Engines], bool] = lambda _: True,
    timeout: float = 30.0, only: Sequence[int] | None = None,
) -> Engines:  # fmt: skip
    """The engines' stats (`only` these model indices: a stopped engine sends none) once
    each of them reported after `since` (time.time()) and `until` holds of them."""
    want = range(len(d.config["models"])) if only is None else only
    deadline = time.monotonic() + timeout
    while True:
        by_model = {int(e["model"]): e for e in raw_stats(d)}
        engines = [by_model[m] for m in want if m in by_model]
        stamped = len(engines) == len(want) and all(e["time"] > since for e in engines)
        if stamped and until(engines):
            return engines
        assert time.monotonic() < deadline, f"no fresh stats with the state wanted: {engines}"
        time.sleep(0.1)


def idle(engines: Engines) -> bool:
    """Nothing held: no page in use, no request running, waiting or away."""
    return all(e["kv_pages_used"] == 0 and e["running"] == e["waiting"] == e["pending"] == 0
               for e in engines)  # fmt: skip


def idle_engines(d: HasAdmin, since: float | None = None, timeout: float = 30.0) -> Engines:
    """The engines' stats once they say nothing is held, stamped after `since` (now by
    default: the caller's requests have all returned)."""
    return fresh_engines(d, time.time() if since is None else since, idle, timeout)


def committed(engines: Engines) -> int:
    """Tokens the engines committed since they started."""
    return sum(e.get("tokens_committed") or 0 for e in engines)
