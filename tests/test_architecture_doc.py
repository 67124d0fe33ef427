"""docs/architecture.md names only what exists: every repository path it mentions
(trd/..., scripts/..., tests/..., docs/...), and every `module: name` pair (a module
path relative to the repository or to trd/, then a function, class or Class.method)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PATH = re.compile(r"(?<![\w/.])((?:trd|scripts|tests|docs)/[\w./-]*[\w/])")
MODULE_NAME = re.compile(r"`([\w/]+\.py)`: `([\w.]+)`")


def module(path: str) -> Path:
    for base in (ROOT, ROOT / "trd"):
        if (base / path).is_file():
            return base / path
    raise AssertionError(f"{path}: no such module")


def defines(tree: ast.Module, dotted: str) -> bool:
    """Whether the module defines `name` or `Class.member` (a def, class or assignment)."""
    scope: list[ast.stmt] = tree.body
    for part in dotted.split("."):
        found = [n for n in scope if part in _names(n)]
        if not found:
            return False
        scope = found[0].body if isinstance(found[0], ast.ClassDef) else []
    return True


def _names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def test_every_path_the_architecture_doc_names_exists() -> None:
    paths = set(PATH.findall(DOC.read_text()))
    assert len(paths) > 20  # the pattern still finds the doc's paths
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_module_name_pair_the_architecture_doc_names_is_defined() -> None:
    pairs = set(MODULE_NAME.findall(DOC.read_text()))
    assert len(pairs) > 20
    missing = sorted(
        f"{path}: {name}"
        for path, name in pairs
        if not defines(ast.parse(module(path).read_text()), name)
    )
    assert not missing, f"docs/architecture.md names what its module does not define: {missing}"


def test_the_check_fails_on_a_stale_name() -> None:
    """`app.py: _texts`, which the page named after the function was gone."""
    tree = ast.parse(module("frontend/app.py").read_text())
    assert defines(tree, "OpenAIApi._generate") and not defines(tree, "_texts")
    assert not defines(tree, "OpenAIApi._texts")
