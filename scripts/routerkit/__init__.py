"""Building blocks of `scripts/eval_routing.py`: sweeps, judging prompts, reports (router
training itself is `trd/routers/`, `tokenrouterd train-router`)."""
