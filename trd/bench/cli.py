"""`tokenrouterd bench NAME ...`: the measuring subcommands."""

from __future__ import annotations

from trd.commands import Subcommand, group_main

COMMANDS = {
    "serve": Subcommand("measure any OpenAI-compatible server at a URL (datasets, closed or "
                        "open loop, TTFT/TPOT/ITL/latency, JSON)", "trd.bench.serve:main"),
    "compare": Subcommand("tokenrouterd against the research loop and standard serving on "
                          "systems it starts, every request checked against the reference "
                          "(--plan smoke|pair|baseline|...)", "trd.bench.compare.cli:main"),
    "ab": Subcommand("a paired A/B of one engine setting (--lever prefix_cache|prefill_ahead): "
                     "two daemons, fresh prompts each round, the order alternating",
                     "trd.bench.ab:main"),
    "engines": Subcommand("routing across engine processes (no HTTP) vs the reference loop, "
                          "on the fixtures", "trd.bench.engines:main"),
    "step": Subcommand("the decode-step cost of one model by variant (dtype x quantisation), "
                       "1 and 16 rows, A/B interleaved in one process", "trd.bench.step:main"),
    "report": Subcommand("bench compare's JSON as markdown tables and plots",
                         "trd.bench.compare.report:main"),
    "llamacpp": Subcommand("build llama.cpp's server (once), or serve a demo GGUF with it",
                           "trd.bench.llamacpp:main"),
}  # fmt: skip


def main(argv: list[str]) -> int:
    return group_main("tokenrouterd bench", "Measure servers: ours, llama.cpp's, any "
                      "OpenAI-compatible one.", COMMANDS, argv)  # fmt: skip
