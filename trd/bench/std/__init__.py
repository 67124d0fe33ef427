"""Standard serving, the baseline the paper calls "Std. Serving": one ordinary single-model
server per model (`server.py`, on our engine with its prefix cache, `engine.py`; time per
phase of a call, `phases.py`), routed token by token from outside over HTTP."""
