"""Commands that tests only read the result of, started early in a niced background
process: mypy, the GPU check's dry run, the benchmark scripts' short runs. In a serial run
they use the core that the other tests leave idle (such a run averages about 1.2 of 2
cores), and their tests wait for them. Under pytest-xdist (the per-commit tier's two
workers) no core is idle and a worker does not know which tests it will get: each test
starts its command when it first asks for it, so no command runs twice.

A test (or a module, through `pytestmark`) opts in with
`@pytest.mark.background.with_args(command)` (a mark's lone callable argument would be
taken as the function it marks), where `command(work)` gives the argv and the environment
to run in a fresh folder `work`. The command starts at collection, or with
`after_models=True` once the tiny fixture models are built (the `tiny_models` fixture: a
niced run must not hold their build lock). The `finished` fixture, or `finished(node)`,
gives the finished run; a test run without its mark collected starts the command itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
NICENESS = 19  # lowest priority: it may only slow the tests it runs beside by a little
Command = Callable[[Path], tuple[list[str], dict[str, str]]]


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str
    work: Path


class Run:
    def __init__(self, command: Command, nice: int) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="trd-background-"))
        argv, env = command(self.work)
        with open(self.work / "stdout", "w") as out, open(self.work / "stderr", "w") as err:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=err, cwd=REPO_ROOT, env={**os.environ, **env},
                preexec_fn=lambda: os.nice(nice),
            )  # fmt: skip

    def wait(self, timeout: float) -> Finished:
        returncode = self.proc.wait(timeout)
        stdout, stderr = ((self.work / n).read_text() for n in ("stdout", "stderr"))
        return Finished(returncode, stdout, stderr, self.work)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()
        shutil.rmtree(self.work, ignore_errors=True)


_runs: dict[Command, Run] = {}
_after_models: list[Command] = []


def lazy() -> bool:
    """Under pytest-xdist every worker collects every test and cannot know which it will
    get: each test starts its own command when it asks."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


def start_collected(items: list[pytest.Item]) -> None:
    if lazy():
        return
    for item in items:
        marker = item.get_closest_marker("background")
        if marker is None:
            continue
        command = marker.args[0]
        if marker.kwargs.get("after_models"):
            if command not in _after_models:
                _after_models.append(command)
        elif command not in _runs:
            _runs[command] = Run(command, NICENESS)


def start_after_models() -> None:
    while _after_models:
        command = _after_models.pop(0)
        _runs.setdefault(command, Run(command, NICENESS))


def finished(node: pytest.Item | pytest.Collector, timeout: float = 900) -> Finished:
    """The node's command run to its end: the run started early, or one started now."""
    marker = node.get_closest_marker("background")
    assert marker is not None, f"{node.nodeid} has no background mark"
    command = marker.args[0]
    if command not in _runs:
        _runs[command] = Run(command, 0)
    return _runs[command].wait(timeout)


def stop_all() -> None:
    for run in _runs.values():
        run.stop()
    _runs.clear()
    _after_models.clear()
