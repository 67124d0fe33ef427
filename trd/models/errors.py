"""The error every checkpoint reader raises."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A directory or file that is not a checkpoint this daemon can serve; says why."""
