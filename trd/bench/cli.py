"""`tokenrouterd bench NAME ...`: the measuring subcommands."""

from __future__ import annotations

from trd.commands import Subcommand, group_main

COMMANDS = {
    "serve": Subcommand("measure any OpenAI-compatible server at a URL (datasets, closed or "
                        "open loop, TTFT/TPOT/ITL/latency, JSON)", "trd.bench.serve:main"),
    "llamacpp": Subcommand("build llama.cpp's server (once), or serve a demo GGUF with it",
                           "trd.bench.llamacpp:main"),
}  # fmt: skip


def main(argv: list[str]) -> int:
    return group_main("tokenrouterd bench", "Measure servers: ours, llama.cpp's, any "
                      "OpenAI-compatible one.", COMMANDS, argv)  # fmt: skip
