"""Inter-process transport on one host: shared-memory rings with eventfd wake-ups (the
transport between hosts is trd/remote/)."""

from __future__ import annotations
