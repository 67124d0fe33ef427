"""The README is the front door: its test command is what CI runs, it stays short, and
the guides it and the docs send a reader to exist, down to the section named."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
READERS = [README, *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "systemd").glob("*"))]
SECTION = re.compile(r'(?P<doc>docs/[\w/-]+\.md|README(?:\.md)?),? "(?P<title>[^"]+)"')
GUIDE = re.compile(r"(?<![\w/.])(?:docs|results)/[\w/-]+\.md")


def commands(text: str) -> list[str]:
    """The command lines of `text`'s ```sh blocks."""
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    readme = README.read_text()
    after = readme.split("Install and run the tests", 1)[1]
    (test_command,) = commands(after)[:1]
    ci = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci == [test_command], f".ci/run runs {ci}, the README says {test_command!r}"


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= 200, f"README.md has {lines} lines: guides go to docs/"


def headings(doc: Path) -> list[str]:
    """`doc`'s sections: its headings and the bold words that open a paragraph."""
    found = re.findall(r"^(?:#+ (.+)|\*\*(.+?)\*\*)", doc.read_text(), re.M)
    return [heading or bold for heading, bold in found]


def broken_links(text: str) -> list[str]:
    """Guides and their sections that `text` names and the repository lacks."""
    text = re.sub(r"\s+", " ", text)
    missing = [name for name in GUIDE.findall(text) if not (ROOT / name).is_file()]
    for m in SECTION.finditer(text):
        doc = ROOT / ("README.md" if m["doc"].startswith("README") else m["doc"])
        if not doc.is_file() or not any(h.startswith(m["title"]) for h in headings(doc)):
            missing.append(f'{m["doc"]}, "{m["title"]}"')
    return missing


def test_the_guides_named_exist() -> None:
    missing = {
        str(doc.relative_to(ROOT)): broken
        for doc in READERS
        if (broken := broken_links(doc.read_text()))
    }
    assert not missing, f"names of guides or sections that do not exist: {missing}"


def test_a_wrong_name_is_caught() -> None:
    assert broken_links('docs/api.md, "The Responses API"') == []
    assert broken_links('docs/api.md, "The Responses\n   API"') == []
    assert broken_links('docs/api.md, "The Requests API"')
    assert broken_links("see docs/no-such-guide.md") == ["docs/no-such-guide.md"]
