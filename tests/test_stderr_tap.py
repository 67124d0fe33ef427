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
