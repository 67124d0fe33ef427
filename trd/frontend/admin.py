"""The admin API that `trctl` talks to; it listens only on loopback or a unix socket.

Loopback is not enough: any web page in the operator's browser can send a "simple"
cross-origin request to 127.0.0.1. So every request that carries an `Origin` header is
refused, a POST must be `application/json` (not a simple request), and with
`admin_token` set every request needs `Authorization: Bearer <token>`.

GET  /status       engines, memory plan, KV pages, MPS, active requests, rates, thresholds,
                   each process's memory (`trd/engines/memory.py`) and each engine's live
                   structures, and with `policy.target_large_share` the share control
                   (target, measured share, threshold in force: trd/supervisor/share.py)
GET  /thresholds   delayed-batching thresholds: what is set and what each engine reports
POST /thresholds   {"thresholds": {"large": [1, 2, 4]}, "max_wait_ms": 20}: apply live
GET  /thresholds/recommend   the Markov model's best thresholds from live measurements
GET  /stats/raw    each engine's latest Stats body: counters and measurement windows

The controllers that steer the engines (rates, share, autotuner) run in the supervisor
(trd/supervisor/control.py); this app only reads them and sets thresholds.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from trd.config import ConfigError, parse_thresholds
from trd.engines.memory import heap, resident
from trd.engines.spec import EngineSpec
from trd.frontend.app import Handler, openai_errors, read_json
from trd.frontend.openai_api import ApiError
from trd.memplan.plan import MemoryPlan
from trd.supervisor.control import Controllers, NoStatistics, TooFewMeasurements
from trd.supervisor.hub import Hub
from trd.supervisor.keeper import EngineKeeper

APPLY_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class MpsState:
    state: str  # "off" | "running"
    reason: str = ""  # why it is off
    pid: int | None = None
    pipe_dir: str = ""


def guard(token: str) -> Any:
    """Middleware refusing cross-origin and non-JSON requests, and missing tokens."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if "Origin" in request.headers:
            raise ApiError(403, "the admin API refuses requests from web pages (Origin header)",
                           code="forbidden")  # fmt: skip
        if request.method == "POST" and request.content_type != "application/json":
            got = request.content_type
            raise ApiError(415, f"content type must be application/json, got {got!r}",
                           code="unsupported_media_type")  # fmt: skip
        if token:
            sent = request.headers.get("Authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
                raise ApiError(401, "missing or wrong admin token (Authorization: Bearer ...)",
                               code="unauthorized")  # fmt: skip
        return await handler(request)

    return check


class AdminApi:
    def __init__(
        self, sup: EngineKeeper, hub: Hub, plan: MemoryPlan, mps: MpsState, controls: Controllers
    ) -> None:
        self.sup, self.hub, self.plan, self.mps, self.controls = sup, hub, plan, mps, controls
        self.started = time.time()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[openai_errors, guard(self.sup.cfg.admin_token)])
        app.router.add_get("/status", self.status)
        app.router.add_get("/thresholds", self.thresholds)
        app.router.add_post("/thresholds", self.set_thresholds)
        app.router.add_get("/thresholds/recommend", self.recommend)
        app.router.add_get("/stats/raw", self.raw_stats)
        return app

    async def recommend(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(await self.controls.recommendation())
        except NoStatistics as exc:
            raise ApiError(503, str(exc), code="no_data") from None
        except TooFewMeasurements as exc:
            raise ApiError(409, str(exc), code="no_data") from None

    def _engines(self) -> list[dict[str, Any]]:
        stats, rates = self.sup.engine_stats(), self.controls.rates.per_second()
        planned = {m.name: m.pages for m in self.plan.models}  # this host's engines only
        out = []
        for spec in self.sup.specs:
            state, pid = self.sup.engine_state(spec)
            s = stats.get(spec.name, {})
            total, used = s.get("kv_pages_total", planned.get(spec.name)), s.get("kv_pages_used")
            tok_s, hand_s = rates.get(spec.name, (None, None))
            # A remote engine's path and device are on its host: its stats say them.
            if isinstance(spec, EngineSpec):
                draft = None if spec.draft is None else str(spec.draft.checkpoint.path)
                where = {"path": str(spec.checkpoint.path), "remote": None, "device": spec.device,
                         "draft": draft}  # fmt: skip
            else:
                where = {"path": s.get("path"), "remote": str(spec.address),
                         "device": s.get("device"), "draft": None}  # fmt: skip
            out.append({
                "model": spec.index, "name": spec.name, **where, "dtype": spec.dtype,
                "pid": pid, "state": state,
                "kv_pages_total": total,
                "kv_pages_used": used, "kv_pages_free": None if used is None else total - used,
                "running": s.get("running"), "waiting": s.get("waiting"),
                "pending": s.get("pending"), "batch_size_mean": s.get("batch_size_mean"),
                "step_ms_p50": s.get("step_ms_p50"), "tokens_per_s": tok_s,
                "handoffs_per_s": hand_s, "tokens_committed": s.get("tokens_committed"),
                "handoffs_out": s.get("handoffs_out"), "thresholds": s.get("thresholds"),
                "max_wait_ms": s.get("max_wait_ms"), "threads": s.get("threads"),
                "wide_forwards": s.get("wide_forwards"), "prefix_cache": s.get("prefix_cache"),
                "prefilling_ahead": s.get("prefilling_ahead"),
                "prefills_ahead": s.get("prefills_ahead"),
                "prefills_adopted": s.get("prefills_adopted"),
                "prefills_late": s.get("prefills_late"),
                "proposed": s.get("proposed"), "accepted": s.get("accepted"),
                "memory": s.get("memory"), "live": s.get("live"),
                "quantization": s.get("quantization"), "crossover": s.get("crossover"),
                "weight_bytes": s.get("weight_bytes"),
            })  # fmt: skip
        return out

    async def status(self, request: web.Request) -> web.Response:
        cfg = self.sup.cfg
        engines = self._engines()
        handoffs = [e["handoffs_per_s"] for e in engines if e["handoffs_per_s"] is not None]
        body = {
            "state": self.hub.state, "reason": self.hub.reason, "pid": os.getpid(),
            "uptime_s": time.time() - self.started, "restarts": self.sup.restarts,
            "memory": {**resident(), **heap(), "heap_trims": self.sup.trimmer.trims},
            "model": "+".join(s.name for s in self.sup.specs),
            "active_requests": len(self.hub.gens), "max_inflight": cfg.max_inflight,
            "policy": {"name": cfg.policy.name, **cfg.policy.params}, "mps": asdict(self.mps),
            "handoffs_per_s": sum(handoffs) if handoffs else None,
            "engines": engines, "thresholds": self._threshold_view(),
            "share": None if self.controls.share is None else self.controls.share.view(),
            "memory_plan": self.plan.to_dict(), "memory_plan_table": self.plan.to_table(),
        }  # fmt: skip
        return web.json_response(body)

    def _threshold_view(self) -> dict[str, Any]:
        stats = self.sup.engine_stats()
        return {
            "max_wait_ms": self.sup.specs[0].batching.max_wait_ms,
            "models": {
                s.name: {
                    "set": list(s.thresholds),
                    "engine": stats.get(s.name, {}).get("thresholds"),
                }
                for s in self.sup.specs
            },
        }

    async def raw_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.sup.engine_stats())

    async def thresholds(self, request: web.Request) -> web.Response:
        return web.json_response(self._threshold_view())

    async def set_thresholds(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict) or set(body) - {"thresholds", "max_wait_ms"}:
            raise ApiError(400, "expected {'thresholds': {model: [B, ...]}, 'max_wait_ms': ms}")
        names = [s.name for s in self.sup.specs]
        raw = body.get("thresholds") or {}
        wait = body.get("max_wait_ms", self.sup.specs[0].batching.max_wait_ms)
        if not isinstance(raw, dict) or (not raw and "max_wait_ms" not in body):
            raise ApiError(400, "thresholds: expected a non-empty {model: [B, ...]} mapping")
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 60e3:
            raise ApiError(400, f"max_wait_ms: expected a number in [0, 60000], got {wait!r}")
        try:
            wanted = {}
            for name, value in raw.items():
                if name not in names:
                    raise ApiError(404, f"thresholds: no model {name!r} (models: {names})")
                wanted[name] = parse_thresholds(
                    f"thresholds.{name}", value, self.sup.cfg.max_inflight
                )
        except ConfigError as exc:
            raise ApiError(400, str(exc)) from None
        self.sup.set_thresholds(wanted, float(wait))
        await self._until_applied()
        return web.json_response(self._threshold_view())

    async def _until_applied(self) -> None:
        """Wait (briefly) until every live engine reports the thresholds just set."""
        deadline = time.monotonic() + APPLY_TIMEOUT_S
        while time.monotonic() < deadline:
            view = self._threshold_view()["models"]
            if all(v["engine"] in (None, v["set"]) for v in view.values()):
                return
            await asyncio.sleep(0.05)
