"""Local, deterministic training text: the prose of Python's own standard library.

Each document is one stdlib module's docstrings and comments with whitespace
normalised. Nothing is downloaded, so fixture models build offline; the text is
English with code identifiers mixed in, which gives next-token entropies a
realistic spread (confident inside identifiers, uncertain between sentences).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
import sysconfig
from pathlib import Path
from typing import Literal

# Whole corpus (both splits) stops growing past this many characters: enough
# text for a vocab-2048 BPE and a few hundred training steps, small enough to
# read in a couple of seconds.
MAX_CHARS = 3_000_000
# One file in this many (by hash of its relative path) is held out.
HELDOUT_EVERY = 10
# Too short to carry a useful document.
MIN_DOC_CHARS = 200
# Test suites and GUI demos are mostly boilerplate; vendored packages are not stdlib prose.
_SKIP_DIRS = frozenset(
    {"test", "tests", "idlelib", "turtledemo", "lib2to3", "site-packages", "ensurepip"}
)
_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")
_DOC_NODES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_COMMENT_LINE = re.compile(r"\s*#+\s*(.*?)\s*$")


def _stdlib_files(root: Path) -> list[Path]:
    files = [
        p
        for p in root.rglob("*.py")
        if not _SKIP_DIRS.intersection(p.relative_to(root).parts)
        and not p.relative_to(root).parts[0].startswith("config-")
    ]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _normalise(text: str) -> str:
    """One line per paragraph, single spaces inside it."""
    paragraphs = (" ".join(p.split()) for p in _PARAGRAPH_BREAK.split(text))
    return "\n".join(p for p in paragraphs if p)


def _docstrings(tree: ast.Module) -> list[str]:
    """Docstrings of the module, classes and functions, walking statements only.

    `ast.walk` would also visit every expression node, which is most of the
    parse time and never holds a docstring.
    """
    docs: list[str] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, _DOC_NODES):
            doc = ast.get_docstring(node, clean=True)
            if doc:
                docs.append(doc)
        for field in ("body", "orelse", "handlers", "finalbody"):
            stack.extend(reversed(getattr(node, field, [])))
    return docs


def _comments(source: str) -> list[str]:
    """Runs of whole-line comments, one paragraph each.

    A line regex instead of `tokenize` (five times slower); trailing comments
    after code are skipped, and a `#` line inside a string literal is rare
    enough not to matter for training text.
    """
    blocks: list[list[str]] = [[]]
    for line in source.splitlines():
        match = _COMMENT_LINE.match(line)
        if match and not match.group(1).startswith("!"):
            blocks[-1].append(match.group(1))
        elif blocks[-1]:
            blocks.append([])
    return [" ".join(b) for b in blocks if b]


def _document(path: Path) -> str:
    source = path.read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    parts = [_normalise(t) for t in (*_docstrings(tree), *_comments(source))]
    return "\n".join(p for p in parts if p)


def _is_heldout(rel_path: str) -> bool:
    digest = hashlib.sha256(rel_path.encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELDOUT_EVERY == 0


@functools.cache
def _split_corpus() -> dict[str, tuple[str, ...]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    splits: dict[str, list[str]] = {"train": [], "heldout": []}
    total = 0
    for path in _stdlib_files(root):
        doc = _document(path)
        if len(doc) < MIN_DOC_CHARS:
            continue
        rel = path.relative_to(root).as_posix()
        splits["heldout" if _is_heldout(rel) else "train"].append(doc)
        total += len(doc)
        if total >= MAX_CHARS:
            break
    return {name: tuple(docs) for name, docs in splits.items()}


def corpus(split: Literal["train", "heldout"]) -> list[str]:
    """Documents of one split, in a fixed order (sorted by stdlib path)."""
    return list(_split_corpus()[split])
