"""Shared-memory segment names, unique per daemon instance, and cleanup after crashes.

Every segment of one daemon instance is named `trd-<pid>-<token>-<rest>`, so the
segments of an instance that died without unlinking them can be found by their pid.
"""

from __future__ import annotations

import os
import re

SHM_DIR = "/dev/shm"
FRONTEND = -1  # node id of the front end; engines are 0..E-1 (their model index)
_OWNED = re.compile(r"trd-(\d+)-")


def instance_prefix(pid: int, token: str) -> str:
    """`trd-<pid>-<token>-`: the prefix of every segment of one daemon instance."""
    if not re.fullmatch(r"[A-Za-z0-9]+", token):
        raise ValueError(f"token must be alphanumeric, got {token!r}")
    return f"trd-{pid}-{token}-"


def node_name(node: int) -> str:
    return "fe" if node == FRONTEND else f"e{node}"


def ring_name(prefix: str, src: int, dst: int) -> str:
    """Name of the ring carrying frames from node `src` to node `dst`."""
    return f"{prefix}{node_name(src)}-{node_name(dst)}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def cleanup_stale(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink the segments of instances whose pid is gone; return the names removed."""
    removed = []
    for name in sorted(os.listdir(shm_dir)):
        m = _OWNED.match(name)
        if m is None or _alive(int(m.group(1))):
            continue
        try:
            os.unlink(os.path.join(shm_dir, name))
        except FileNotFoundError:  # another process cleaned it first
            continue
        removed.append(name)
    return removed
