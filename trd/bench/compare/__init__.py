"""`tokenrouterd bench compare`: tokenrouterd against the systems a user would pick instead,
on systems it starts itself (`cli.py`).

    plan.py, runner.py      the plans, and the run of every system on every workload:
                            the official-style loop (the reference), the daemon and its
                            ablations, standard serving; identity of every request
    agent.py, agent_run.py  the agent workload (multi-turn, resending); agent_table.py
    baseline.py             the demo pair beside llama.cpp's server (--plan baseline)
    ceiling.py, stepcost.py the forward-only ceiling and the batching bound
    targets.py, notes.py, tables.py, plots.py, report.py
                            like-for-like verdicts and the markdown report
    systems.py, pairs.py, workloads.py
                            how each system is named and reached, the pairs, the prompts
"""
