"""trd/models/cache.py: a folder appears whole or not at all, and processes that race for
it build it once."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from trd.models.cache import cache_base, folder_lock, is_complete, publish

FILES = ("a.txt", "b.txt")


def _build(tmp: Path) -> None:
    (tmp / "m").mkdir()
    for name in FILES:
        (tmp / "m" / name).write_text(name)


def _ensure(root: Path) -> None:
    """What every cached model's ensure_* does: check, and build only if missing."""
    with folder_lock(root, "m"):
        if not is_complete(root / "m", FILES):
            with (root / "builds.log").open("a") as log:
                log.write("built\n")
            publish(root, _build, ["m"])


def test_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    def half(tmp: Path) -> None:
        (tmp / "m").mkdir()
        (tmp / "m" / "a.txt").write_text("a")
        raise RuntimeError("the import failed")

    with pytest.raises(RuntimeError, match="the import failed"):
        publish(tmp_path, half, ["m"])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_publish_replaces_an_incomplete_leftover(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.txt").write_text("stale")
    publish(tmp_path, _build, ["m"])
    assert is_complete(tmp_path / "m", FILES)
    assert (tmp_path / "m" / "a.txt").read_text() == "a.txt"


def test_racing_processes_build_once(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_ensure, args=(tmp_path,)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert (tmp_path / "builds.log").read_text() == "built\n"
    assert is_complete(tmp_path / "m", FILES)


def test_cache_base_is_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRD_CACHE_DIR", "rel")
    assert cache_base() == tmp_path / "rel"
    assert cache_base(Path("other")) == tmp_path / "other"
