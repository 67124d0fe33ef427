"""What a load-aware gateway reads from a real daemon: the vLLM-named gauges and the probes.

The endpoint picker of the Gateway API Inference Extension takes the FIRST series of
each family (trd/frontend/vllm_metrics.py), so each gauge must have exactly one. The
counts are driven deterministically: with the entry engine stopped (SIGSTOP) admitted
requests cannot get a token, so they are all waiting; once it runs on they are running;
when they are done every gauge is back to 0.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon_fixture import Daemon, start_daemon, write_config

NAMES = ["small", "large"]
GAUGES = {
    "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_running": "running",
    "vllm:kv_cache_usage_perc": "kv",
}
Scrape = dict[str, list[tuple[dict[str, str], float]]]


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]
) -> Iterator[Daemon]:
    d = start_daemon(write_config(tmp_path_factory.mktemp("e2e_gateway"), tiny_models, NAMES))
    yield d
    assert d.stop() == 0, d.log()


def scrape(d: Daemon) -> Scrape:
    status, text = d.get("/metrics")
    assert status == 200
    return {
        f.name: [(dict(s.labels), s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def gauges(m: Scrape) -> dict[str, float]:
    """waiting, running, kv: the one value of each vLLM gauge (the picker reads the first)."""
    out = {}
    for name, key in GAUGES.items():
        ((labels, value),) = m[name]
        assert labels == {"model_name": "small+large"}, (name, labels)
        out[key] = value
    return out


def fullest_engine(m: Scrape) -> float:
    used = {labels["model"]: v for labels, v in m["trd_kv_pages_used"]}
    total = {labels["model"]: v for labels, v in m["trd_kv_pages_total"]}
    return max(used[k] / total[k] for k in total)


def wait_for(d: Daemon, want: Callable[[dict[str, float]], bool], what: str) -> Scrape:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = scrape(d)
        if want(gauges(m)):
            return m
        time.sleep(0.05)
    raise AssertionError(f"the gauges never showed {what}: {gauges(scrape(d))}")


def stream(d: Daemon, max_tokens: int) -> int:
    chunks = d.client().completions.create(
        model=d.model, prompt="def main(", max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    usage = [c.usage.completion_tokens for c in chunks if c.usage]  # reads the stream to its end
    return usage[-1]


def test_idle_daemon_shows_one_series_per_gauge_and_each_engines_cache(daemon: Daemon) -> None:
    assert daemon.get("/ready") == (200, {"status": "serving"})
    assert daemon.get("/health") == (200, {"status": "ok"})
    m = scrape(daemon)
    assert gauges(m) == {"waiting": 0, "running": 0, "kv": 0}
    engines = daemon.status()["engines"]
    info = [labels for labels, value in m["vllm:cache_config_info"] if value == 1]
    assert [i["engine"] for i in info] == NAMES  # the entry engine first: the one read
    for labels, engine in zip(info, engines, strict=True):
        assert labels["model_name"] == "small+large"
        assert labels["block_size"] == "16"  # engine.page_size's default
        assert labels["num_gpu_blocks"] == str(engine["kv_pages_total"])


def test_gauges_follow_requests_from_queued_to_running_to_done(daemon: Daemon) -> None:
    entry = daemon.status()["engines"][0]["pid"]
    n, max_tokens = 3, 400
    os.kill(entry, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(n) as pool:
            futures = [pool.submit(stream, daemon, max_tokens) for _ in range(n)]
            queued = gauges(wait_for(daemon, lambda g: g["waiting"] == n, f"{n} waiting"))
            assert queued["running"] == 0  # admitted, and no engine could give a token
            os.kill(entry, signal.SIGCONT)
            m = wait_for(daemon, lambda g: g["running"] >= 1 and g["kv"] > 0, "running, KV held")
            g = gauges(m)
            assert g["waiting"] + g["running"] <= n  # each request counted once
            assert g["kv"] == pytest.approx(fullest_engine(m))  # same scrape, same stats
            assert [f.result(timeout=120) for f in futures] == [max_tokens] * n
    finally:
        os.kill(entry, signal.SIGCONT)
    # Pages are freed once the engines finish; their stats say so within 0.5 s.
    m = wait_for(daemon, lambda g: g == {"waiting": 0, "running": 0, "kv": 0}, "all 0")
    assert fullest_engine(m) == 0
