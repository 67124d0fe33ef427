"""OpenAI's Responses API (POST /v1/responses) served through chat's generation path."""

from __future__ import annotations
