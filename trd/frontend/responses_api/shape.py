"""The response object of one /v1/responses request, in OpenAI's shape:

    {"id": "resp_<hex>", "object": "response", "created_at": .., "status": "completed",
     "output": [message and function_call items], "usage": {"input_tokens": ..,
     "output_tokens": .., "total_tokens": .., ..}, the request's settings echoed
     (instructions, model, tools, tool_choice, text, temperature, top_p, ...),
     "tokens_per_model": {"small": 40, "large": 9}, "model_switches": 7,
     "large_share": 0.1837}

As on chat, the response carries next to `usage` the per-model counts (and whatever else
chat's usage reports). Status "incomplete" with incomplete_details
{"reason": "max_output_tokens"} when the output was cut off. `cached_tokens` is 0: the
engines do not report prefix-cache hits per request.
"""

from __future__ import annotations

import time
from typing import Any

from trd.frontend.openai_api import GenRequest
from trd.frontend.responses import Usage
from trd.frontend.responses_api.schema import ResponsesRequest


def _usage(usage: Usage) -> dict[str, Any]:
    fields = usage.fields()
    counts = fields.pop("usage")
    return {
        "usage": {
            "input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": counts["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"],
        },
        **fields,  # tokens_per_model, model_switches, large_share
    }


class ResponseShape:
    def __init__(
        self, rid: str, req: ResponsesRequest, body: dict[str, Any], gen: GenRequest, model: str
    ) -> None:
        self.id = rid
        self.created_at = int(time.time())
        temperature, top_p = gen.source.temperature, gen.source.top_p
        fmt = req.text.format if req.text is not None else None
        self.settings = {
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {},
            "model": model,
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": req.store is not False,
            "temperature": 1.0 if temperature is None else temperature,
            "top_p": 1.0 if top_p is None else top_p,
            "text": {"format": fmt or {"type": "text"}},
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [],
            "truncation": "disabled",
            "background": False,
            "user": req.user,
        }

    def body(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: Usage | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The response at `status` (in_progress, completed, incomplete, failed)."""
        done = status in ("completed", "incomplete")
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if done else None,
            "error": error,
            "incomplete_details": incomplete,
            "output": output,
            **self.settings,
            **(_usage(usage) if usage is not None else {"usage": None}),
        }
