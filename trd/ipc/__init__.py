"""Inter-process transport: shared-memory rings with eventfd wake-ups, and TCP framing."""

from __future__ import annotations
