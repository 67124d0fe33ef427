"""Fixture models for tests, benchmarks and `--demo`: tiny Qwen3 LMs sharing one tokenizer.

`build.ensure_models()` returns cached checkpoint folders, building them from
the standard library's own docstrings the first time (no downloads).
"""

from __future__ import annotations
