"""`tokenrouterd bench report --headline DOC`: the short form, written into a guide.

DOC (docs/benchmarks.md) holds blocks that name their result files, paths from the
checkout's root:

    <!-- bench report --headline: results/A/result.json results/B/result.json -->
    ... generated ...
    <!-- end of bench report --headline -->

and each block's body is regenerated from its files, nothing else in DOC changing:
the target rows of every `bench compare` plan in one table (a row per target and plan;
rows whose runs the plan did not have are left out), each plan's throughputs at its
largest N, where and when it ran (the machine's load at the start where the file has
it), the command that makes the file again, and links to the file and its full report
(`report.md` beside it, when there is one). A `--plan baseline` file gets its own table,
as `bench compare` printed it. Every number comes from the files, so a block that differs
from what this writes is stale (tests/test_doc_numbers.py regenerates and compares).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from trd.bench.compare import baseline
from trd.bench.compare.legacy import reproduce, upgrade
from trd.bench.compare.targets import FULL, target_rows
from trd.bench.identity import identity

OPEN = "<!-- bench report --headline: "
CLOSE = "<!-- end of bench report --headline -->"
BLOCK = re.compile(re.escape(OPEN) + r"(?P<files>[^>]*?) -->\n.*?" + re.escape(CLOSE), re.S)
SHOWN = ("official", FULL, "std")  # the systems whose throughputs a plan's line gives


def read(path: Path) -> dict[str, Any]:
    """A `bench compare` result file in the schema's names (older files upgraded)."""
    return upgrade(json.loads(path.read_text()))


def top(data: dict[str, Any]) -> int:
    return max(data["plan"]["ns"])


def command(data: dict[str, Any], name: str) -> str:
    """The command that writes this file again, its --out being `name`."""
    cmd = reproduce(data)
    if "--out" in cmd:
        cmd[cmd.index("--out") + 1] = name
    return " ".join(cmd)


def where(data: dict[str, Any]) -> str:
    m = data["machine"]
    start = m.get("start")
    load = "load average {} at the start".format("/".join(f"{x:g}" for x in start["load"])) \
        if start else "load average not recorded"  # fmt: skip
    minutes = f", {data['total_s'] / 60:.1f} min" if "total_s" in data else ""
    return f"{data['started']}, {m['cores']} CPU cores ({m['cpu']}), {load}{minutes}"


def throughputs(data: dict[str, Any]) -> str:
    """Output tokens/s of the main systems on the short workload and the longest output,
    each at the largest N it ran them."""
    longest = max((r["max_tokens"] for r in data["runs"] if r["workload"].startswith("long")),
                  default=0)  # fmt: skip
    shown = {"short", f"long@{longest}"}
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for r in data["runs"]:
        key = (r["system"], r["workload"])
        if r["system"] in SHOWN and r["workload"] in shown and (
                key not in best or r["n"] > best[key]["n"]):  # fmt: skip
            best[key] = r
    return "; ".join(f"{s} {w} N={r['n']} {r['output_throughput']:.1f}"
                     for (s, w), r in sorted(best.items()))  # fmt: skip


def links(path: Path, doc: Path, root: Path) -> str:
    """Markdown links from DOC to the result file and its full report, if any."""

    def rel(p: Path) -> str:
        return Path(os.path.relpath(root / p, doc.parent)).as_posix()

    out = f"[result]({rel(path)})"
    if (root / path).with_name("report.md").exists():
        out += f", [full report]({rel(path.with_name('report.md'))})"
    return out


def run_line(path: Path, data: dict[str, Any], doc: Path, root: Path, measured: str) -> str:
    """A plan's line under its table: where and when, what, its files, the command."""
    return (f"- `{data['plan_name']}`: {where(data)}{measured} ({links(path, doc, root)}):  \n"
            f"  `{command(data, path.as_posix())}`")  # fmt: skip


def compare_table(files: list[tuple[Path, dict[str, Any]]], doc: Path, root: Path) -> list[str]:
    """One table of every plan's target rows; a line per plan: its run and command."""
    lines = ["| plan | ratio | target | measured | verdict | why |", "|---|---|---|---|---|---|"]
    notes = []
    for path, data in files:
        ident = identity(data["runs"], data["reference"])
        for row in target_rows(data["runs"], ident, top(data), data["pair"]["name"]):
            if row.measured != "not run":
                lines.append(f"| `{data['plan_name']}` |{row.markdown()[1:]}")
        notes.append(run_line(path, data, doc, root, f"; output tokens/s: {throughputs(data)}"))
    return [*lines, "", *notes]


def block(names: list[str], doc: Path, root: Path) -> list[str]:
    files = [(Path(n), read(root / n)) for n in names]
    plans = [(p, d) for p, d in files if d["plan_name"] not in baseline.BASELINES]
    parts = [compare_table(plans, doc, root)] if plans else []
    parts += [[*baseline.table(d["runs"]), "", run_line(p, d, doc, root, "")]
              for p, d in files if d["plan_name"] in baseline.BASELINES]  # fmt: skip
    return [line for i, part in enumerate(parts) for line in ([""] if i else []) + part]


def regenerate(text: str, doc: Path, root: Path) -> str:
    """`text` (DOC's content) with every block's body written anew from its files."""

    def body(m: re.Match[str]) -> str:
        names = m["files"].split()
        return "\n".join([f"{OPEN}{' '.join(names)} -->", *block(names, doc, root), CLOSE])

    return BLOCK.sub(body, text)


def update(doc: Path, root: Path) -> bool:
    """Rewrite DOC's blocks; True when anything changed."""
    doc, root = doc.resolve(), root.resolve()
    old = doc.read_text()
    new = regenerate(old, doc, root)
    if not BLOCK.search(old):
        raise ValueError(f"{doc}: no `{OPEN}FILES -->` block to fill")
    doc.write_text(new)
    return new != old
