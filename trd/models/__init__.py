"""Checkpoints: the one reader of HF directories, GGUF import, rope settings."""
