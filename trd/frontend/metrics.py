"""Prometheus metrics: request outcomes and latencies, tokens per model, engine gauges.

Request-side series are updated as requests finish. Engine-side series are read from
the engines' latest Stats at scrape time (a collector), so they cost nothing between
scrapes. Next to the `trd_*` series, the vLLM-named gauges a load-aware gateway reads
(`vllm_metrics.py`). Every series lives in the app's own registry.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trd.engines.spec import EngineSpec
from trd.frontend.responses import Usage
from trd.frontend.vllm_metrics import VllmCollector
from trd.remote.spec import RemoteSpec
from trd.supervisor.generation import Generation

# TTFT on the CPU demo is tens of ms; on a loaded GPU host seconds.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
# A request's large share: none at all is common (the small model was sure throughout)
_SHARE_BUCKETS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)

EngineStats = Callable[[], dict[str, dict[str, Any]]]  # engine name -> latest Stats body


class _EngineCollector(Collector):
    # (metric name, stats key, help)
    GAUGES = (
        ("trd_engine_queue_depth", "waiting", "Requests waiting for a forward on the engine"),
        ("trd_engine_running", "running", "Requests in the engine's running set"),
        ("trd_engine_pending", "pending", "Requests handed to a peer, keeping their KV pages"),
        ("trd_engine_prefilling_ahead", "prefilling_ahead", "Prompts the engine prefills ahead"),
        ("trd_engine_batch_size", "batch_size_mean", "Mean batch size of recent forwards"),
        ("trd_engine_step_ms_p50", "step_ms_p50", "Median forward latency in ms"),
        ("trd_kv_pages_used", "kv_pages_used", "KV cache pages in use"),
        ("trd_kv_pages_total", "kv_pages_total", "KV cache pages of the engine"),
        ("trd_engine_resident_bytes", "memory.rss_bytes", "Resident memory of the engine process"),
        ("trd_engine_resident_anon_bytes", "memory.anon_bytes",
         "Resident anonymous memory of the engine process (not its mapped weights)"),
        ("trd_engine_heap_in_use_bytes", "memory.heap_in_use_bytes",
         "Bytes allocated in the engine's malloc heap"),
        ("trd_engine_heap_free_bytes", "memory.heap_free_bytes",
         "Bytes freed and kept in the engine's malloc heap for reuse"),
        ("trd_engine_requests", "live.requests", "Requests the engine holds (any state)"),
        ("trd_engine_prefix_cache_blocks", "live.prefix_blocks", "KV blocks in the prefix cache"),
        ("trd_engine_grammars_cached", "live.grammars_cached",
         "Compiled grammars the engine keeps (at most engine.grammar_cache)"),
    )  # fmt: skip
    COUNTERS = (
        ("trd_handoffs", "handoffs_out", "Handoffs sent to another model"),
        ("trd_engine_tokens_committed", "tokens_committed", "Output tokens the engine committed"),
        ("trd_engine_steps", "steps", "Forwards the engine ran"),
        ("trd_engine_busy_seconds", "busy_s", "Seconds the engine spent in its steps"),
        ("trd_engine_grammar_mask_seconds", "mask_s", "Seconds of steps spent on grammar masks"),
        (
            "trd_engine_heap_trims",
            "memory.heap_trims",
            "Times the engine gave its heap's free pages back to the kernel (malloc_trim)",
        ),
        (
            "trd_engine_wide_forwards",
            "wide_forwards",
            "Forwards run on the idle cores of the host too (engine.threads_alone)",
        ),
    )

    def __init__(self, stats: EngineStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self.stats()
        for name, key, doc in self.GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["model"])
            for model, body in stats.items():
                value = _value(body, key)
                if isinstance(value, int | float):
                    family.add_metric([model], float(value))
            yield family
        for name, key, doc in self.COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=["model"])
            for model, body in stats.items():
                value = _value(body, key)
                if isinstance(value, int | float):
                    counter.add_metric([model], float(value))
            yield counter


def _value(body: dict[str, Any], key: str) -> Any:
    """body[key], or for "a.b" body["a"]["b"]; None where it is missing."""
    value: Any = body
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


class Metrics:
    def __init__(
        self,
        engine_stats: EngineStats,
        requests: Callable[[], Collection[Generation]],
        model_name: str,
        engines: Sequence[EngineSpec | RemoteSpec],
    ) -> None:
        """`requests`: those in flight (the Hub's); `engines`: the specs, entry first."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "trd_requests", "Finished requests by endpoint and HTTP status",
            ["endpoint", "status"], registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter("trd_prompt_tokens", "Prompt tokens served", registry=r)
        self.tokens = Counter(
            "trd_generated_tokens", "Output tokens by producing model", ["model"], registry=r
        )
        self.switches = Counter(
            "trd_model_switches", "Changes of producing model between output tokens", registry=r
        )
        self.ttft = Histogram(
            "trd_time_to_first_token_seconds", "Time to first token", registry=r,
            buckets=_LATENCY_BUCKETS,
        )  # fmt: skip
        self.tpot = Histogram(
            "trd_time_per_output_token_seconds", "Time per output token after the first",
            registry=r, buckets=_TOKEN_BUCKETS,
        )  # fmt: skip
        self.e2e = Histogram(
            "trd_e2e_request_latency_seconds", "Request latency, arrival to last token",
            registry=r, buckets=_LATENCY_BUCKETS,
        )  # fmt: skip
        self.large_share = Histogram(
            "trd_request_large_share",
            "Per finished choice with output: the share of its tokens the last (largest) "
            "model wrote (routing.large_share holds it per request)",
            registry=r, buckets=_SHARE_BUCKETS,
        )  # fmt: skip
        Gauge("trd_active_requests", "Requests in flight", registry=r).set_function(
            lambda: float(len(requests()))
        )
        ProcessCollector(registry=r)  # the supervisor's own process_resident_memory_bytes, ...
        r.register(_EngineCollector(engine_stats))
        r.register(VllmCollector(model_name, requests, engine_stats, engines))

    def observe(
        self,
        endpoint: str,
        status: int,
        usage: Usage,
        ttft: float | None,
        e2e: float,
        large_shares: Sequence[float] = (),
    ) -> None:
        """A finished request: its usage, latencies and each choice's large share."""
        self.requests.labels(endpoint, str(status)).inc()
        self.prompt_tokens.inc(usage.prompt_tokens)
        for model, n in usage.tokens_per_model.items():
            self.tokens.labels(model).inc(n)
        self.switches.inc(usage.model_switches)
        if ttft is not None:
            self.ttft.observe(ttft)
            if usage.completion_tokens > 1:
                self.tpot.observe((e2e - ttft) / (usage.completion_tokens - 1))
        self.e2e.observe(e2e)
        for share in large_shares:
            self.large_share.observe(share)

    def render(self) -> bytes:
        return generate_latest(self.registry)
