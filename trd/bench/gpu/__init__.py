"""`tokenrouterd bench compare --plan gpu`: the routed pair at real sizes on one GPU,
against what that machine can run instead, in one budgeted run (docs/gpu.md).

    run.py       the stages in order inside one budget; `--dry-run`: the CPU, tiny shapes
    plan.py      what is measured (GpuPlan), the dry run's plan, a run's folders (Ctx)
    stage.py     one stage in a process of its own
    prepare.py   checkpoints (trd/testing/shaped.py) and flashinfer's kernels, at once
    bounds.py    bandwidth, each engine's step costs alone, HBM and batching bounds
    routed.py    tokenrouterd daemons (MPS on/off, a share each); the large model alone
    hf.py        the transformers loop (same schedule) and generate (static cache)
    policies.py  each policy's device path, graphs on vs off, token for token
    workload.py  prompts, the seeded schedule, the designed tokens every system must write
    measure.py   one run's record; targets.py, report.py: verdicts, the result, the tables
    versions.py  what ran
"""
