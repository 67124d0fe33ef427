"""The vLLM-named series a load-aware gateway reads from `/metrics`.

The Gateway API Inference Extension's endpoint picker (EPP; llm-d's router and KServe run
the same code) scrapes each Ready pod's `/metrics` every 50 ms and reads, under vLLM's
names (its defaults; each can be renamed by a flag):

    vllm:num_requests_waiting   its queue scorer: the pod with the shortest queue
    vllm:num_requests_running   requests the pod is serving
    vllm:kv_cache_usage_perc    its KV-cache scorer: the pod with the most free KV, 0..1
    vllm:cache_config_info      labels block_size and num_gpu_blocks (prefix-cache scorer)

and, for dashboards, vLLM's prefix-cache counters, a series per engine (label `engine`):
`vllm:prefix_cache_queries` (tokens of requests that looked up a cached prefix) and
`vllm:prefix_cache_hits` (of those, tokens served from the cache); hits / queries is
the hit rate. An engine restarts them from 0 when it restarts (its cache is empty).

In each family it takes the series whose labels match its spec (no labels by default)
with the newest timestamp. Our samples carry no timestamp, so it takes the FIRST series:
each gauge therefore has exactly one series per pod (a series per engine would have the
picker read the entry engine alone), labelled `model_name` like vLLM's. A request counts
once, whichever engine holds it; the two counts come from the supervisor's own view of
the requests, exact at scrape time; KV use comes from the engines' stats (0.5 s old at
most).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trd.engines.spec import EngineSpec
from trd.remote.spec import RemoteSpec
from trd.supervisor.generation import Generation

WAITING_HELP = (
    "Requests admitted and without their first output token yet: queued on the entry "
    "engine or in prefill (vLLM counts a prefilling request as running). Each request "
    "counts once, whichever engine holds it."
)
RUNNING_HELP = (
    "Requests that have produced at least one output token and are not finished, on "
    "whichever engine makes their next token. Each request counts once."
)
KV_HELP = (
    "KV-cache use of the fullest engine, 0..1 (pages in use / pages): the first engine "
    "to run out of pages limits what the pod can take. From the engines' latest stats."
)
CACHE_HELP = (
    "KV cache of each engine, value 1: block_size = tokens per page, num_gpu_blocks = "
    "its pages (on CPU too), cache_dtype. The entry engine's series comes first."
)

QUERIES_HELP = "Tokens of the requests that looked up a cached prefix on this engine."
HITS_HELP = "Of the tokens looked up, those served from this engine's prefix cache."


class VllmCollector(Collector):
    def __init__(
        self,
        model_name: str,
        requests: Callable[[], Collection[Generation]],
        engine_stats: Callable[[], dict[str, dict[str, Any]]],
        engines: Sequence[EngineSpec | RemoteSpec],
    ) -> None:
        self.model_name, self.requests, self.engine_stats = model_name, requests, engine_stats
        self.engines = sorted(engines, key=lambda s: s.index)

    def collect(self) -> Iterator[Metric]:
        waiting = running = 0
        for gen in self.requests():
            if gen.complete:
                continue  # finished (or failed); its handler is sending the last bytes
            if gen.tokens:
                running += 1
            else:
                waiting += 1
        yield self._gauge("vllm:num_requests_waiting", WAITING_HELP, waiting)
        yield self._gauge("vllm:num_requests_running", RUNNING_HELP, running)
        yield self._gauge("vllm:kv_cache_usage_perc", KV_HELP, self._kv_usage())
        info = GaugeMetricFamily(
            "vllm:cache_config_info", CACHE_HELP,
            labels=["model_name", "engine", "block_size", "num_gpu_blocks", "cache_dtype"],
        )  # fmt: skip
        stats = self.engine_stats()
        for spec in self.engines:
            # A remote engine's pages are planned on its host: its stats say how many.
            pages = stats.get(spec.name, {}).get("kv_pages_total", spec.kv_pages)
            labels = [spec.name, str(spec.settings.page_size), str(pages), spec.dtype]
            info.add_metric([self.model_name, *labels], 1.0)
        yield info
        yield from self._prefix_cache(stats)

    def _prefix_cache(self, stats: dict[str, dict[str, Any]]) -> Iterator[Metric]:
        names = ["model_name", "engine"]
        queries = CounterMetricFamily("vllm:prefix_cache_queries", QUERIES_HELP, labels=names)
        hits = CounterMetricFamily("vllm:prefix_cache_hits", HITS_HELP, labels=names)
        for spec in self.engines:
            cache = stats.get(spec.name, {}).get("prefix_cache")
            if cache:  # off, or no stats yet
                queries.add_metric([self.model_name, spec.name], cache["queries"])
                hits.add_metric([self.model_name, spec.name], cache["hits"])
        yield queries
        yield hits

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["model_name"])
        family.add_metric([self.model_name], float(value))
        return family

    def _kv_usage(self) -> float:
        usage = 0.0  # no live engine (restarting): nothing is held
        for body in self.engine_stats().values():
            used, total = body.get("kv_pages_used"), body.get("kv_pages_total")
            if isinstance(used, int) and isinstance(total, int) and total > 0:
                usage = max(usage, used / total)
        return usage
