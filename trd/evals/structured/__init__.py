"""`tokenrouterd eval structured`: constrained outputs on any OpenAI-compatible server
(`run.py`), on the 50 tasks of `tasks.py` (schemas, regexes, choices, tool calls)."""
