"""Start, check and stop a CUDA MPS control daemon private to this tokenrouterd.

The daemon's pipe and log directories live under our runtime directory with
mode 0700, so only our own engines can reach it:

    runtime_dir/mps/pipe/  control, control_privileged (sockets), control_lock, log
    runtime_dir/mps/log/   control.log, server.log

The daemon is given the GPU by UUID (CUDA_VISIBLE_DEVICES), as NVIDIA's MPS docs advise:
its server renumbers the devices it sees, so an index could name another GPU.

The real binary writes no pid file. Its pid comes from the `control` socket
itself (SO_PEERCRED): that finds a daemon left by a crashed earlier instance
even when it hangs, and a socket file whose daemon is gone refuses the connection.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

from trd.mps.driver import MPS_CONTROL, branch_mismatch, driver_version

log = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 10.0
START_TIMEOUT_S = 10.0
QUIT_TIMEOUT_S = 10.0
# sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107


class MpsError(RuntimeError):
    """MPS could not be used; the message says which command failed and how."""


def daemon_pid(pipe_dir: Path) -> int | None:
    """Pid of the control daemon listening in `pipe_dir`, or None when none listens."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(str(pipe_dir / "control"))
        cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    finally:
        sock.close()
    pid, _uid, _gid = struct.unpack("3i", cred)
    return pid


def is_running(pid: int) -> bool:
    """Whether any thread of `pid` still runs; a zombie has exited (our init may never reap it).

    Every thread counts: a killed leader turns zombie while its other threads are
    still exiting and still hold the daemon's files (its `control_lock` among them).
    """
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return False
    return any(_task_alive(task / "stat") for task in tasks)


def _task_alive(stat_path: Path) -> bool:
    try:
        stat = stat_path.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state letter follows the parenthesised command name, which may hold spaces.
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while is_running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


class MpsManager:
    """One MPS control daemon whose pipe and log directories are under `runtime_dir`."""

    def __init__(self, runtime_dir: Path, binary: str = MPS_CONTROL, gpu_uuid: str = "") -> None:
        self.root = Path(runtime_dir) / "mps"
        self.pipe_dir = self.root / "pipe"
        self.log_dir = self.root / "log"
        self.binary = binary
        self.gpu_uuid = gpu_uuid
        # The daemon cannot bind a longer socket path and fails without saying why.
        longest = self.pipe_dir / "control_privileged"
        if len(os.fsencode(longest)) > MAX_SOCKET_PATH:
            raise MpsError(
                f"MPS pipe path {longest} exceeds {MAX_SOCKET_PATH} bytes; "
                "use a shorter runtime directory"
            )

    @property
    def pid(self) -> int | None:
        """The control daemon's pid, while it runs."""
        return daemon_pid(self.pipe_dir)

    def _env(self) -> dict[str, str]:
        env = self.engine_env()
        if self.gpu_uuid:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu_uuid
        return env

    def engine_env(self) -> dict[str, str]:
        """Environment variables an engine process needs to run under this daemon."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    def query(self, command: str) -> str:
        """Send one control command (e.g. "get_server_list") to our daemon; its answer."""
        return self._run(stdin=command + "\n")

    def _run(self, *args: str, stdin: str = "") -> str:
        """Run the control binary against our daemon; its stdout, or MpsError."""
        cmd = [self.binary, *args]
        shown = " ".join(cmd) + (f" <<< {stdin.strip()!r}" if stdin else "")
        try:
            done = subprocess.run(
                cmd,
                input=stdin,
                env={**os.environ, **self._env()},
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
            )
        except FileNotFoundError:
            raise MpsError(f"{shown}: {self.binary} not found") from None
        except subprocess.TimeoutExpired:
            raise MpsError(f"{shown}: no answer within {COMMAND_TIMEOUT_S:g} s") from None
        if done.returncode != 0:
            # The binary reports some failures on stdout, others on stderr.
            output = (done.stderr + done.stdout).strip()
            raise MpsError(f"{shown}: exit code {done.returncode}: {output}")
        return done.stdout

    def start(self) -> None:
        """Start our daemon (stopping one a crashed instance left) and check that it answers."""
        for d in (self.root, self.pipe_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o700)  # mkdir's mode is masked by umask and ignored if d exists
        mismatch = branch_mismatch(self.binary, driver_version())
        if mismatch:
            raise MpsError(mismatch)
        stale = daemon_pid(self.pipe_dir)
        if stale is not None:
            log.warning("stopping MPS control daemon %d left in %s", stale, self.pipe_dir)
            self._shutdown(stale)
        try:
            self._run("-d")
            self._wait_answers()
        except MpsError:
            self.stop()
            raise
        log.info("MPS control daemon %s running, pipe %s", self.pid, self.pipe_dir)

    def _wait_answers(self) -> None:
        # The daemon forks before it binds its socket; retry until it answers.
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                self.query("get_server_list")
                return
            except MpsError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def _shutdown(self, pid: int) -> None:
        try:
            self.query("quit")
        except MpsError as exc:
            log.warning("MPS quit failed, will kill %d: %s", pid, exc)
        if _wait_gone(pid, QUIT_TIMEOUT_S):
            return
        log.warning("MPS control daemon %d ignored quit for %g s; killing it", pid, QUIT_TIMEOUT_S)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if not _wait_gone(pid, QUIT_TIMEOUT_S):
            raise MpsError(f"MPS control daemon {pid} survived SIGKILL")

    def stop(self) -> None:
        """Quit the daemon (SIGKILL if it will not go) and remove its directories; idempotent."""
        if self.pipe_dir.exists():
            pid = daemon_pid(self.pipe_dir)
            if pid is not None:
                self._shutdown(pid)
        shutil.rmtree(self.root, ignore_errors=True)
