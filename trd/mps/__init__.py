"""The managed CUDA MPS control daemon that lets engine processes share a GPU."""

from __future__ import annotations
