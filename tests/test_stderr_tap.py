"""The daemon routes fd 2 through a tap (a pipe and a copying thread) so that it can show
an engine's last lines when it fails. A daemon that exits right after printing, as on a
config or memory-plan error, must still get every line out: `StderrTap.close` drains it.
(Without the close, the same script lost lines on 3 of 3 tries.)"""

from __future__ import annotations

import subprocess
import sys

LINES = 400

EXIT_AFTER_PRINTING = f"""
import os, sys
from trd.logs import StderrTap
tap = StderrTap()
for i in range({LINES}):
    print(f"line {{i}}: the models do not fit in memory", file=sys.stderr)
{{close}}
os._exit(2)  # at once, as a process that is done: no interpreter shutdown to wait on
"""


def run(close: str) -> list[str]:
    code = EXIT_AFTER_PRINTING.replace("{close}", close)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    return done.stderr.splitlines()


def test_a_closed_tap_lets_every_line_out_before_the_process_exits() -> None:
    lines = run("tap.close()")
    assert lines == [f"line {i}: the models do not fit in memory" for i in range(LINES)]


TRACKER_STARTED_AFTER_THE_TAP = """
from multiprocessing import shared_memory
from trd.logs import StderrTap
tap = StderrTap()
segment = shared_memory.SharedMemory(create=True, size=64)  # starts the resource tracker
segment.close()
segment.unlink()
tap.close(timeout_s=5.0)
print("still held" if tap._copier.is_alive() else "drained")
"""


def test_close_does_not_wait_on_the_resource_tracker() -> None:
    """The first shared-memory ring starts multiprocessing's resource tracker, which
    outlives the daemon's stop; when it held the tap's pipe, close() waited its whole
    timeout on every stop (2 s each). In a fresh process, as in the daemon."""
    done = subprocess.run([sys.executable, "-c", TRACKER_STARTED_AFTER_THE_TAP],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["drained"], "a child still holds the tap's pipe"
