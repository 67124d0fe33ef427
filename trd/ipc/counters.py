"""A few shared int64 counters: the global view delayed batching needs.

    slot 0          active requests in the daemon (written by the front end)
    slot 1 + i      requests runnable or running on engine i (written by engine i)
    slot 1 + E + i  forwards engine i has completed (the step_sync ablation's barrier)
    slot 1 + 2E + i engine i runs a forward on more threads than its share (`ThreadShare`)

Each slot has exactly one writer; readers tolerate a stale value (it only makes an
engine launch a little early or late, or two engines run wide for one forward, never
deadlocks: see the max_wait guard). Remote links mirror the first 1 + 2E slots
(`num_slots`); the last E are about this host's cores and stay on it.
"""

from __future__ import annotations

import contextlib
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from trd.ipc.ring import map_segment

ACTIVE = 0


class Counters:
    def __init__(self, name: str, num_engines: int, shm: SharedMemory | None = None) -> None:
        self.name, self.num_engines = name, num_engines
        self._shm = shm
        self._mm = map_segment(name)
        self._slots = np.frombuffer(self._mm, dtype=np.int64, count=1 + 3 * num_engines)

    @classmethod
    def create(cls, name: str, num_engines: int) -> Counters:
        shm = SharedMemory(name, create=True, size=8 * (1 + 3 * num_engines))
        shm.close()
        return cls(name, num_engines, shm)

    def __reduce__(self) -> tuple[Any, ...]:
        return Counters, (self.name, self.num_engines)

    @property
    def active(self) -> int:
        return int(self._slots[ACTIVE])

    def set_active(self, n: int) -> None:
        self._slots[ACTIVE] = n

    def busy(self, engine: int) -> int:
        return int(self._slots[1 + engine])

    def set_busy(self, engine: int, n: int) -> None:
        self._slots[1 + engine] = n

    def steps(self, engine: int) -> int:
        return int(self._slots[1 + self.num_engines + engine])

    def set_steps(self, engine: int, n: int) -> None:
        self._slots[1 + self.num_engines + engine] = n

    def wide(self, engine: int) -> bool:
        return bool(self._slots[1 + 2 * self.num_engines + engine])

    def set_wide(self, engine: int, wide: bool) -> None:
        self._slots[1 + 2 * self.num_engines + engine] = int(wide)

    def engine_slots(self, engine: int) -> tuple[int, int]:
        """The slots engine `engine` writes; a remote-engine link mirrors them by number."""
        return 1 + engine, 1 + self.num_engines + engine

    @property
    def num_slots(self) -> int:
        """The slots remote links mirror."""
        return 1 + 2 * self.num_engines

    def read(self, slots: list[int]) -> dict[int, int]:
        return {s: int(self._slots[s]) for s in slots}

    def write(self, values: dict[int, int]) -> None:
        for slot, value in values.items():
            self._slots[slot] = value

    def others_idle(self, engine: int) -> bool:
        return all(self._slots[1 + j] == 0 for j in range(self.num_engines) if j != engine)

    def close(self) -> None:
        """Unmap; the owner also unlinks. Safe to call twice."""
        if self._shm is not None:
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()
            self._shm = None
        if not self._mm.closed:
            del self._slots  # the view must go before the mapping can close
            self._mm.close()
