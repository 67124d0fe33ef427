"""Test and demo material, not part of the serving path: the fixture models
(`tinymodels/`, `--demo tiny`) and the float64 routing oracle (`reference.py`)."""
