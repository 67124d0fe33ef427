"""Stored responses (`store`, the default): what previous_response_id continues and
GET /v1/responses/{id} returns, kept in memory, the oldest dropped past a bound.

    id -> Stored(body, conversation)
          body          the response as it was returned
          conversation  its turns as chat messages: the stored turns it continued, its
                        input, its output (instructions left out: they are not carried over)

Each conversation fit the context when it was served, so a stored response holds at
most about max_model_len tokens of text; chained responses share their messages. The
bound (`responses.max_stored` in the config) is a count; `/metrics` shows how many are
kept (trd_responses_stored) and how many were dropped for it (trd_responses_evicted).
Nothing survives a restart.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from trd.frontend.errors import ApiError, describe


@dataclass(frozen=True, slots=True)
class Stored:
    body: dict[str, Any]
    conversation: Sequence[dict[str, Any]]


class ResponseStore:
    def __init__(self, capacity: int, registry: CollectorRegistry) -> None:
        self.capacity = capacity
        self.kept: OrderedDict[str, Stored] = OrderedDict()  # oldest first
        Gauge("trd_responses_stored", "Responses kept for previous_response_id",
              registry=registry).set_function(lambda: float(len(self.kept)))  # fmt: skip
        self.evicted = Counter(
            "trd_responses_evicted", "Stored responses dropped to keep responses.max_stored",
            registry=registry,
        )  # fmt: skip

    def put(self, rid: str, stored: Stored) -> None:
        self.kept[rid] = stored
        while len(self.kept) > self.capacity:
            self.kept.popitem(last=False)
            self.evicted.inc()

    def get(self, rid: str, param: str | None = None) -> Stored:
        """The stored response, or a 404 in OpenAI's shape (`param`: the field that named it)."""
        found = self.kept.get(rid)
        if found is None:
            raise self._missing(rid, param)
        return found

    def delete(self, rid: str) -> None:
        if self.kept.pop(rid, None) is None:
            raise self._missing(rid, None)

    def _missing(self, rid: str, param: str | None) -> ApiError:
        why = (f"unknown, stored with store=false, deleted, or dropped to keep the last "
               f"{self.capacity} (responses.max_stored)")  # fmt: skip
        where = f"{param}: " if param else ""
        code = "previous_response_not_found" if param else "not_found"
        msg = f"{where}no response {describe(rid)} is stored here: {why}"
        return ApiError(404, msg, param, code)
