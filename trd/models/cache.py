"""Where built or imported checkpoints live, and the lock that lets racing processes make
each one once.

    <cache base>/.<folder>.lock   flock'ed while that folder is checked or built
    <cache base>/<folder>/        config.json model.safetensors tokenizer.json ...

A folder appears only by `os.rename` of a finished build, so a reader never sees half a
checkpoint; a crash leaves at most a `.build-*` temp folder. The demo pair
(`trd/demo/qwen.py`), SmolLM2 (`trd/testing/smollm2.py`) and the fixture models
(`trd/testing/tinymodels/`) are all made this way.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", *TOKENIZER_FILES)


def cache_base(cache_dir: Path | None = None) -> Path:
    """cache_dir, else $TRD_CACHE_DIR, else ~/.cache/tokenrouterd.

    Absolute, so the paths handed to engines and written into configs do not depend on
    the working directory of whoever reads them.
    """
    base = cache_dir or Path(
        os.environ.get("TRD_CACHE_DIR") or Path.home() / ".cache" / "tokenrouterd"
    )
    return Path(base).expanduser().absolute()


@contextmanager
def locked(root: Path, name: str = ".lock") -> Iterator[None]:
    """Exclusive lock on root (created if needed) across processes, by the file root/name:
    builds that publish different folders into one root may take one lock file each."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / name, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def folder_lock(root: Path, folder: str) -> AbstractContextManager[None]:
    """The lock of one published folder of root (its own lock file, `.<folder>.lock`), so
    that builds of different folders in one root do not wait on each other."""
    return locked(root, f".{folder}.lock")


def is_complete(folder: Path, files: tuple[str, ...]) -> bool:
    return all((folder / f).is_file() for f in files)


def readable_by_all(folder: Path) -> None:
    """Open a checkpoint folder written here to every user: mkdtemp and safetensors create
    owner-only modes, and the daemon may run as another user (the unit's DynamicUser)."""
    for path in (folder, *folder.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)


def publish(root: Path, build: Callable[[Path], object], names: list[str]) -> None:
    """Run build(tmp) and move each tmp/<name> to root/<name>, readable by every user;
    caller holds the lock."""
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        build(tmp)
        for name in names:
            readable_by_all(tmp / name)
            if (root / name).exists():  # an incomplete leftover of an older layout
                shutil.rmtree(root / name)
            os.rename(tmp / name, root / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
