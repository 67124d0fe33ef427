"""`tokenrouterd eval routing`: every routing policy's quality against its large-model
share on one pair, on real engine processes (`main.py`; sweeps in `sweep.py`, the judging
prompts in `judging.py`, plots and the equal-share table in `report.py`)."""
