"""Memory planning: weights, KV capacity and reserves of every model per device."""

from __future__ import annotations
