"""Two hosts on one machine: a network namespace joined to this one by a veth pair.

    this namespace                                   namespace trd-<tag>
    trdA<tag>  169.254.<x>.<4k+1>/30  <== veth ==>  trdB<tag>  169.254.<x>.<4k+2>/30

Link-local addresses, never routed beyond the pair; <x> and <k> come from the tag (the
pid), so concurrent runs do not collide. Needs CAP_NET_ADMIN: `why_not()` says what is
missing, for a skip. `close()` removes the pair and the namespace (also after a
half-done setup) and kills what still runs inside.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from types import TracebackType


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


def why_not() -> str | None:
    """None when namespaces and veth pairs can be made here, else why not."""
    probe = f"trd-probe-{os.getpid()}"
    try:
        made = _ip("netns", "add", probe)
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return f"the ip tool is not usable: {exc}"
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


class NetNs:
    def __init__(self, tag: int | None = None) -> None:
        tag = os.getpid() if tag is None else tag
        self.name = f"trd-{tag}"
        self.host_if, self.peer_if = f"trdA{tag}", f"trdB{tag}"
        net = f"169.254.{1 + tag % 254}."
        base = 4 * ((tag // 254) % 63)
        self.host_ip, self.peer_ip = f"{net}{base + 1}", f"{net}{base + 2}"
        try:
            self._run("netns", "add", self.name)
            self._run("link", "add", self.host_if, "type", "veth", "peer", "name", self.peer_if)
            self._run("link", "set", self.peer_if, "netns", self.name)
            self._run("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            self._run("link", "set", self.host_if, "up")
            for args in (
                ("addr", "add", f"{self.peer_ip}/30", "dev", self.peer_if),
                ("link", "set", self.peer_if, "up"),
                ("link", "set", "lo", "up"),
            ):
                self._run("netns", "exec", self.name, "ip", *args)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _run(*args: str) -> None:
        done = _ip(*args)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside the namespace (the same pid: ip execs it)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def set_link(self, up: bool) -> None:
        """Cut (or restore) the cable: this side's end of the pair goes down (or up)."""
        self._run("link", "set", self.host_if, "up" if up else "down")

    def close(self) -> None:
        pids = _ip("netns", "pids", self.name).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("link", "del", self.host_if)  # takes the peer end with it
        _ip("netns", "del", self.name)

    def __enter__(self) -> NetNs:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
