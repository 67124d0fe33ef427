"""Structured outputs: grammars, their compilation and per-request matchers (llguidance)."""
