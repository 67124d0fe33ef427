"""The first code an engine process runs: tie its life to the supervisor's, then start.

Kept free of heavy imports, and so is what a spawned engine imports before it: `spawn`
makes a child import the parent's main module (as __mp_main__) first, in case the target
lives there; run as `python -m trd.daemon` or `tokenrouterd` that is the whole front end
(aiohttp, pydantic, transformers: about 2 s of CPU per engine, and its memory for the
engine's life), so engines start inside `without_main`.

The kernel kills the engine when the process that spawned it dies (PR_SET_PDEATHSIG),
but only if that process is still alive when the signal is armed; the check that our
parent is still the spawner closes that window, so an engine never outlives a supervisor
killed at any moment, even during start.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from trd.logs import exit_now

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(1)  # the supervisor died before the signal was armed


@contextmanager
def without_main() -> Iterator[None]:
    """Processes spawned inside import no main module: our targets live in trd modules."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def engine_process(parent_pid: int, *args: Any) -> None:
    """multiprocessing target of every engine process."""
    die_with_parent(parent_pid)
    from trd.engines.loop import engine_main  # torch and the model code load only now

    engine_main(*args)
    exit_now(0)  # stopped: the rings are closed, nothing else is ours to finish
