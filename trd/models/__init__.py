"""Checkpoints: the one reader of HF directories, rope settings, GGUF import."""
