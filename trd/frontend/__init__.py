"""The HTTP front end: OpenAI-compatible API, admin API and metrics, in the supervisor."""

from __future__ import annotations
