"""Numbers quoted in the docs are the result files' numbers.

- A quoted measurement carries its source right after it, invisible when rendered:
  `13.4 s<!-- src results/DIR/FILE.json runs[system=tokenrouterd].ttft_p50 -->`. The
  expression after the file is a JSON path (keys joined by `.`; `[k=v,k2=v2]` picks the
  one element of a list whose fields match, `[3]` by index), or paths and numbers joined
  by ` / ` and ` * ` (left to right): `... / ... ` for a ratio, `... * 100` for a percent.
  The quoted number must be the expression's value at the quoted precision (13.4 for
  13.39 and 13.44, not 13.5; `1,024` reads as 1024).
- A number that is a setting of the code, not a measurement, names where it is set:
  `every 0.5 s<!-- code trd/remote/bridge.py HEARTBEAT_S -->`; the file must assign NAME
  that value (`NAME = 0.5`, a field `NAME: float = 0.5`, YAML's `NAME: 0.5`).
- In README.md and the guides (STRICT; outside code), a number with a unit of measure
  (tokens/s, tok/s, ms, us, s, x, %) with neither is an error: measurements are quoted
  from result files, or not at all. The reports of runs (benchmarks, quality, structured,
  demo, gpu, notes/) are not held to it yet.
- docs/benchmarks.md's headline blocks are what `tokenrouterd bench report --headline`
  writes from the files they name, byte for byte.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from trd.bench.compare import headline

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
GUIDES = ["api", "architecture", "models", "operating", "routing", "scaling"]
STRICT = [ROOT / "README.md", *(ROOT / "docs" / f"{name}.md" for name in GUIDES)]

NUMBER = r"(?P<num>\d[\d,]*(?:\.\d+)?)"
UNIT = r"(?:\s?(?:tokens/s|tok/s|x|%)|\s(?:ms|us|s))"  # "400s" are status codes
SOURCED = re.compile(NUMBER + UNIT + r"?\s*<!-- src (?P<file>\S+) (?P<expr>.+?) -->")
SETTING = re.compile(NUMBER + UNIT + r"?\s*<!-- code (?P<file>\S+) (?P<name>\w+) -->")
MEASURE = re.compile(r"(?<![\w.])" + NUMBER + UNIT + r"(?![\w/])")
CODE = re.compile(r"```.*?```|`[^`\n]*`|<!--.*?-->", re.S)
SEGMENT = re.compile(r"(?P<key>[^.\[\]]+)?(?P<picks>(?:\[[^\]]*\])*)")


@cache
def load(name: str) -> Any:
    return json.loads((ROOT / name).read_text())


def pick(items: list[Any], spec: str) -> Any:
    """`items`' element named by `spec`: an index, or `k=v,...` matching one element."""
    if spec.lstrip("-").isdigit():
        return items[int(spec)]
    want = dict(kv.split("=", 1) for kv in spec.split(","))
    found = [x for x in items if all(str(x.get(k)) == v for k, v in want.items())]
    if len(found) != 1:
        raise LookupError(f"[{spec}] matches {len(found)} elements, not one")
    return found[0]


def resolve(data: Any, path: str) -> float:
    """The number at `path` in `data` (see the module's note)."""
    for part in re.split(r"\.(?![^\[]*\])", path):
        m = SEGMENT.fullmatch(part)
        if m is None or not part:
            raise LookupError(f"bad path segment {part!r}")
        if m["key"]:
            data = data[m["key"]]
        for spec in re.findall(r"\[([^\]]*)\]", m["picks"]):
            data = pick(data, spec)
    if isinstance(data, bool) or not isinstance(data, int | float):
        raise LookupError(f"{path} is {data!r}, not a number")
    return float(data)


def evaluate(file: str, expr: str) -> float:
    """Operands (JSON paths in `file`, or numbers) joined by ` / ` and ` * `."""
    tokens = expr.split()
    value = operand(file, tokens[0])
    for op, term in zip(tokens[1::2], tokens[2::2], strict=True):
        if op not in ("/", "*"):
            raise LookupError(f"operator {op!r}: only / and *")
        rhs = operand(file, term)
        value = value / rhs if op == "/" else value * rhs
    return value


def operand(file: str, term: str) -> float:
    try:
        return float(term)
    except ValueError:
        return resolve(load(file), term)


def agrees(quoted: str, value: float) -> bool:
    """`quoted` is `value` at the quoted number's precision."""
    decimals = len(quoted.partition(".")[2])
    return abs(float(quoted.replace(",", "")) - value) <= 0.5 * 10**-decimals + 1e-9


def check_sources(text: str) -> list[str]:
    """What is wrong with the source markers of a document's `text` (empty: nothing)."""
    errors = []
    for m in SOURCED.finditer(text):
        where = f"{m['num']} <- {m['file']} {m['expr']}"
        try:
            value = evaluate(m["file"], m["expr"])
        except (OSError, LookupError, KeyError, IndexError, TypeError, ValueError) as exc:
            errors.append(f"{where}: {type(exc).__name__}: {exc}")
            continue
        if not agrees(m["num"], value):
            errors.append(f"{where}: the file says {value:.6g}")
    return errors


def check_settings(text: str) -> list[str]:
    """The settings `text` quotes that their files do not assign as quoted."""
    errors = []
    for m in SETTING.finditer(text):
        path = ROOT / m["file"]
        code = path.read_text() if path.is_file() else ""
        assigned = re.findall(rf"^\s*{m['name']}\s*(?:=|:[^=\n]*=|:)\s*([\d_.]+)\b", code, re.M)
        if not any(agrees(m["num"], float(v.replace("_", ""))) for v in assigned):
            errors.append(
                f"{m['num']} <- {m['file']} {m['name']}: assigned {assigned or 'nowhere'}"
            )
    return errors


def unsourced(text: str) -> list[str]:
    """Measurements in `text` (outside code and comments) that name no source."""
    sourced = {m.start("num") for r in (SOURCED, SETTING) for m in r.finditer(text)}
    prose = CODE.sub(lambda m: " " * len(m.group()), text)  # keeps every offset
    return [m.group() for m in MEASURE.finditer(prose) if m.start("num") not in sourced]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_quoted_numbers_are_the_result_files(doc: Path) -> None:
    text = doc.read_text()
    errors = check_sources(text) + check_settings(text)
    assert not errors, f"{doc.name}: quoted numbers differ from their sources:\n" + "\n".join(
        errors
    )


@pytest.mark.parametrize("doc", STRICT, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_measurement_has_a_source(doc: Path) -> None:
    missing = unsourced(doc.read_text())
    assert not missing, f"{doc.name}: measurements without a `<!-- src FILE PATH -->`: {missing}"


def test_the_headline_is_what_bench_report_writes() -> None:
    doc = ROOT / "docs" / "benchmarks.md"
    text = doc.read_text()
    assert headline.BLOCK.search(text), "docs/benchmarks.md has no headline block"
    assert headline.regenerate(text, doc, ROOT) == text, (
        "docs/benchmarks.md's headline differs from its result files: run "
        "`tokenrouterd bench report --headline docs/benchmarks.md`"
    )


def test_the_checks_catch_what_they_should() -> None:
    """Each rule fails a document that breaks it (a wrong number, a wrong path, no source)."""
    src = "results/2026-12-04-agent-demo/demo_n4.json"
    path = "runs[system=tokenrouterd].ttft_p50"
    assert check_sources(f"p50 13.4 s<!-- src {src} {path} -->") == []
    assert check_sources(f"p50 13.5 s<!-- src {src} {path} -->")
    assert check_sources(f"p50 13.4 s<!-- src {src} runs[system=std].ttft_p50 -->")
    assert check_sources(f"p50 13.4 s<!-- src {src} runs[n=4].ttft_p50 -->")  # 3 match
    ratio = f"runs[system=tokenrouterd_nocache].ttft_p50 / {path}"
    assert check_sources(f"6.2x<!-- src {src} {ratio} -->") == []
    assert check_sources(f"6.3x<!-- src {src} {ratio} -->")
    assert unsourced("a later turn in 13.4 s, `--port 8000` and `0.5 s`") == ["13.4 s"]
    beat = "trd/remote/bridge.py HEARTBEAT_S"
    assert check_settings(f"every 0.5 s<!-- code {beat} -->") == []
    assert check_settings(f"every 0.6 s<!-- code {beat} -->")
    assert check_settings("every 0.5 s<!-- code trd/remote/bridge.py NO_SUCH -->")
    assert unsourced(f"every 0.5 s<!-- code {beat} -->") == []
    assert unsourced(f"in 13.4 s<!-- src {src} {path} -->, 16 conversations") == []
    sleep = "deploy/kubernetes/deployment.yaml seconds"  # YAML: `seconds: 5`
    assert check_settings(f"a 5 s<!-- code {sleep} --> sleep") == []
    assert check_settings(f"a 6 s<!-- code {sleep} --> sleep")
    assert unsourced("refused schemas are 400s, `50ms` by default") == []
