"""Subcommand tables: `tokenrouterd NAME ...` and `tokenrouterd bench NAME ...` hand the
rest of the command line to the module a table names (vLLM's CLISubcommand idea, without
building every parser up front: a subcommand's imports load only when it runs).

A table maps a name to its one-line summary and `module:function`, a function taking the
remaining arguments and returning the exit code.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Subcommand:
    summary: str
    target: str  # "module:function", the function taking argv and returning an exit code

    def run(self, argv: list[str], *extra: Any) -> int:
        module, _, name = self.target.partition(":")
        return int(getattr(importlib.import_module(module), name)(argv, *extra))


def listing(prog: str, table: Mapping[str, Subcommand]) -> str:
    """The table as help text: one line a subcommand."""
    width = max(map(len, table)) + 2
    rows = "\n".join(f"  {name:{width}}{cmd.summary}" for name, cmd in table.items())
    return f"subcommands ({prog} NAME --help for each):\n{rows}"


def group_main(prog: str, doc: str, table: Mapping[str, Subcommand], argv: list[str]) -> int:
    """A command made only of subcommands (`tokenrouterd bench`): run the one named, or
    print the listing (exit 0 when asked for help, 2 when no or an unknown name)."""
    if argv and argv[0] in table:
        return table[argv[0]].run(argv[1:])
    asked = bool(argv) and argv[0] in ("-h", "--help")
    out = sys.stdout if asked else sys.stderr
    if argv and not asked:
        print(f"{prog}: unknown subcommand {argv[0]!r}", file=out)
    print(f"usage: {prog} NAME [ARGS...]\n\n{doc}\n\n{listing(prog, table)}", file=out)
    return 0 if asked else 2
