"""HumanEval pass@1 of routed systems: prompts, a sandbox, statistics, scoring, report."""
