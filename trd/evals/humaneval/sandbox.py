"""Run an untrusted program in its own process: time, memory and file-size limits, no
network, a scratch directory; whatever it does, the caller gets a verdict in bounded time.

    unshare --net  python -I -c RUNNER  (cwd: a fresh temporary directory, removed after)

RUNNER, before the program is even compiled, sets its limits with setrlimit (address
space MEMORY_BYTES, CPU seconds, output file size, no core files), replaces the socket
constructors with ones that raise (a second wall behind the empty network namespace, and
the only one where `unshare --net` is refused, e.g. not root: `network()` says which is in
force), then executes the program with `__name__` set to "__sandbox__" (a `__main__` block
of the completion does not run). It prints a random marker only when the program returned:
an exit code of 0 after `sys.exit(0)` or `os._exit(0)` is not a pass. The parent waits
TIMEOUT_S of wall time, then kills the process group (children included).
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 10.0
CPU_S = 10
MEMORY_BYTES = 1 << 30
OUTPUT_BYTES = 1 << 20
FILE = "program.py"

RUNNER = """
import os, resource, socket, sys
resource.setrlimit(resource.RLIMIT_AS, ({mem}, {mem}))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))
resource.setrlimit(resource.RLIMIT_FSIZE, ({out}, {out}))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
def _refuse(*args, **kwargs):
    raise OSError("network disabled in the sandbox")
socket.socket = socket.create_connection = socket.socketpair = _refuse
marker = os.environ.pop("SANDBOX_MARKER")
source = open({file!r}).read()
exec(compile(source, {file!r}, "exec"), {{"__name__": "__sandbox__"}})
sys.stdout.flush()
os.write(1, ("\\n" + marker + "\\n").encode())
"""


@dataclass(frozen=True, slots=True)
class Verdict:
    passed: bool
    reason: str  # "passed", "timed out", or the exit status and the output's last line


@functools.cache
def network() -> str:
    """How the network is kept out: "unshare" (an empty network namespace) when
    `unshare --net` works here, else "socket-preamble" (the runner's raising sockets)."""
    try:
        ok = subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "socket-preamble"
    return "unshare" if ok.returncode == 0 else "socket-preamble"


def run_program(source: str, timeout_s: float = TIMEOUT_S, isolate_net: bool = True) -> Verdict:
    """Run `source` as described above; `isolate_net=False` leaves out the namespace (only
    the runner's sockets keep the network out), for tests of that wall alone."""
    marker = secrets.token_hex(16)
    runner = RUNNER.format(mem=MEMORY_BYTES, cpu=CPU_S, out=OUTPUT_BYTES, file=FILE)
    argv = [sys.executable, "-I", "-c", runner]
    if isolate_net and network() == "unshare":
        argv = ["unshare", "--net", *argv]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SANDBOX_MARKER": marker}
    with tempfile.TemporaryDirectory(prefix="sandbox-") as scratch:
        (Path(scratch) / FILE).write_text(source)
        out_path = Path(scratch) / "output.txt"
        with out_path.open("wb") as out:
            proc = subprocess.Popen(
                argv, cwd=scratch, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
            finally:
                _kill_group(proc)
        timed_out = proc.returncode is None or proc.returncode == -signal.SIGKILL
        output = _tail(out_path)
    if marker in output and proc.returncode == 0:
        return Verdict(True, "passed")
    if timed_out:
        return Verdict(False, "timed out")
    last = next((line for line in reversed(output.splitlines()) if line.strip()), "")
    return Verdict(False, f"exit {proc.returncode}: {last[:200]}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """The program's whole process group, children it left behind included."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _tail(path: Path, size: int = 4096) -> str:
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - size))
        return f.read().decode(errors="replace")
