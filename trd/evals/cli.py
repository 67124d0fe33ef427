"""`tokenrouterd eval NAME ...`: the quality evaluations."""

from __future__ import annotations

from trd.commands import Subcommand, group_main

COMMANDS = {
    "humaneval": Subcommand("HumanEval pass@1 of any OpenAI-compatible server at a URL, "
                            "each completion sandboxed (JSON)", "trd.evals.humaneval.run:main"),
    "compare": Subcommand("HumanEval result files side by side: intervals, paired "
                          "differences, the gap recovered", "trd.evals.humaneval.compare:main"),
    "nll": Subcommand("add each HumanEval completion's NLL under the large model to result "
                      "files", "trd.evals.humaneval.nll:main"),
    "routing": Subcommand("every routing policy's quality against its large-model share on "
                          "one pair: threshold sweeps, plots", "trd.evals.routing.main:main"),
    "structured": Subcommand("structured outputs on any OpenAI-compatible server: validity, "
                             "large share, tok/s with and without constraints, mask time",
                             "trd.evals.structured.run:main"),
    "demo": Subcommand("the demo pair's answers: small alone, large alone, routed; NLL under "
                       "the large model, step costs (JSON, docs/demo.md)", "trd.evals.demo:main"),
    "calibrate": Subcommand("the threshold that leaves the large model a target share "
                            "(R-Stitch, GlimpRouter): estimate or bisection",
                            "trd.evals.calibrate:main"),
}  # fmt: skip


def main(argv: list[str]) -> int:
    return group_main("tokenrouterd eval", "Evaluate quality: ours, llama.cpp's server, any "
                      "OpenAI-compatible one.", COMMANDS, argv)  # fmt: skip
