"""Checkpoints: readers and importers that produce HF-format model directories."""
