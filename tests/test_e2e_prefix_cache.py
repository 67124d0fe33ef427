"""The prefix cache in a real daemon: eviction under pressure, prefill ahead, a client
gone while its request waits on a stopped engine, then an engine killed.

One float64 daemon, each engine's KV pool 32 pages of 16 tokens. Eight requests in
flight at once share one of two 96-token heads (6 pages each) and need 3 to 5 pages of
their own: 44 pages, more than the pool, so cached blocks are evicted and requests
preempted during the routed run; a second round finds the heads cached. The large model
prefills each prompt as it arrives (engine.prefill_ahead), so those prefills compete for
its pages too. Outputs must be
the float64 oracle's; afterwards `trctl status` must show 0 used pages and every cached
page evictable on every engine (an engine that found a page freed twice or leaked would
have failed its idle integrity check and been restarted). Which of a prompt's Submit and
its request's handoff reaches the large engine first is a race in that run; with the
entry engine stopped (SIGSTOP) the Submit must come first and be prefilled ahead. A
client that leaves while its request is handed to a stopped large engine: the entry
engine frees it at once, the large one drops the late handoff without a token, every
cached page stays evictable and the cache still gives the oracle's output. Killing an
engine with cached pages (SIGKILL) leaves one engine group's segments, and its successor
starts empty. Engine stats are read fresh (engine_status.py): stamped after the event.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.testing.reference import ReferenceRouter

from daemon_fixture import SCHEDULE, Daemon, shm_segments, start_daemon, write_config
from engine_status import fresh_engines, idle, idle_engines
from routing_cases import prompts

NAMES = ["small", "large"]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]
) -> Iterator[Daemon]:
    extra = {
        "memory": {"max_kv_tokens": 512},  # 32 pages per engine
        "max_model_len": 256,
        "restart": {"max_retries": 1, "backoff_s": 0.2},
        # The large model prefills every prompt as it arrives, competing for the pages.
        "engine": {"threads": 1, "max_batch_tokens": 512, "prefill_ahead": True},
    }
    tmp = tmp_path_factory.mktemp("e2e_prefix_cache")
    d = start_daemon(write_config(tmp, tiny_models, NAMES, dtype="float64", **extra))
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture(scope="module")
def work(tiny_models: dict[str, Path]) -> list[list[int]]:
    text = [p for p in prompts(tiny_models["small"], 64) if len(p) >= 48]
    heads = [text[0][:48] + text[1][:48], text[2][:48] + text[3][:48]]
    return [heads[i % 2] + text[4 + i][: 3 + 5 * i] for i in range(8)]


@pytest.fixture(scope="module")
def oracle(tiny_models: dict[str, Path], work: list[list[int]]) -> list[list[int]]:
    ref = ReferenceRouter(
        [tiny_models[n] for n in NAMES], PolicySpec("scripted", {"schedule": SCHEDULE})
    )
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    return [ref.run(p, params).tokens for p in work]


def complete(d: Daemon, prompt: list[int]) -> list[int]:
    extra = {"ignore_eos": True, "return_token_ids": True}
    r = d.client().completions.create(
        model=d.model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, extra_body=extra
    )
    return list((r.choices[0].model_extra or {})["token_ids"])


def hits_metric(d: Daemon) -> dict[str, float]:
    status, text = d.get("/metrics")
    assert status == 200
    (family,) = [f for f in text_string_to_metric_families(text)
                 if f.name == "vllm:prefix_cache_hits"]  # fmt: skip
    return {s.labels["engine"]: s.value for s in family.samples if s.name.endswith("_total")}


def test_eviction_under_pressure_keeps_outputs_and_leaks_nothing(
    daemon: Daemon, work: list[list[int]], oracle: list[list[int]]
) -> None:
    assert [e["kv_pages_total"] for e in daemon.status()["engines"]] == [32, 32]
    for _ in range(2):
        with ThreadPoolExecutor(len(work)) as pool:
            got = list(pool.map(lambda p: complete(daemon, p), work))
        assert got == oracle
    engines = idle_engines(daemon)
    for e in engines:
        cache = e["prefix_cache"]
        assert (e["running"], e["waiting"], e["pending"]) == (0, 0, 0), e
        assert cache["cached_pages"] == cache["evictable_pages"] > 0, e  # all evictable
        assert 0 < cache["hits"] < cache["queries"], e
    assert sum(e["prefix_cache"]["evictions"] for e in engines) > 0
    # Every prompt went to the large engine too, ahead of its request or late.
    ahead = [e["prefills_ahead"] + e["prefills_late"] for e in engines]
    assert ahead == [0, 2 * len(work)], engines
    status = daemon.status()
    assert status["restarts"] == 0, daemon.log()  # no engine failed its integrity check
    assert hits_metric(daemon)["small"] == engines[0]["prefix_cache"]["hits"]


def test_with_the_entry_engine_stopped_the_prompt_is_prefilled_ahead(
    daemon: Daemon, work: list[list[int]], oracle: list[list[int]]
) -> None:
    small, large = idle_engines(daemon)
    os.kill(small["pid"], signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(complete, daemon, work[2])
            sent = time.time()
            fresh_engines(daemon, sent, lambda e: e[0]["prefills_ahead"] > large["prefills_ahead"],
                          only=[1])  # fmt: skip
            os.kill(small["pid"], signal.SIGCONT)
            assert answer.result(timeout=60) == oracle[2]
    finally:
        os.kill(small["pid"], signal.SIGCONT)
    after = idle_engines(daemon)[1]
    assert after["prefills_late"] == large["prefills_late"]
    assert after["prefix_cache"]["hits"] > large["prefix_cache"]["hits"]  # its own prefill


def test_a_client_gone_while_its_request_waits_on_a_stopped_engine(
    daemon: Daemon, work: list[list[int]], oracle: list[list[int]]
) -> None:
    large = idle_engines(daemon)[1]
    body = {"model": daemon.model, "prompt": work[3], "max_tokens": 100, "temperature": 0,
            "stream": True, "ignore_eos": True}  # fmt: skip
    payload = json.dumps(body).encode()
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    os.kill(large["pid"], signal.SIGSTOP)
    try:
        with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as sock:
            sock.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
            sent = time.time()
            # The schedule hands position 2 to the large engine: the request is away there.
            fresh_engines(daemon, sent, lambda e: e[0]["pending"] == 1, only=[0])
        left = time.time()
        # The entry engine frees its part while the large one cannot even read the abort.
        fresh_engines(daemon, left, idle, only=[0])
    finally:
        os.kill(large["pid"], signal.SIGCONT)
    engines = idle_engines(daemon)
    for e in engines:
        assert e["prefix_cache"]["cached_pages"] == e["prefix_cache"]["evictable_pages"], e
    # The handoff that waited for it was dropped: not one token made for a client gone.
    assert engines[1]["tokens_committed"] == large["tokens_committed"]
    assert complete(daemon, work[3]) == oracle[3]  # its cached prefix serves the same prompt


def test_a_killed_engine_leaves_nothing_and_its_successor_starts_empty(
    daemon: Daemon, work: list[list[int]], oracle: list[list[int]]
) -> None:
    assert complete(daemon, work[0]) == oracle[0]
    large = idle_engines(daemon)[1]
    assert large["prefix_cache"]["cached_pages"] > 0
    os.kill(large["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 90
    while daemon.status()["engines"][1]["pid"] in (large["pid"], None):
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.2)
    daemon.wait_ready(timeout=90)
    fresh = idle_engines(daemon)[1]["prefix_cache"]
    assert (fresh["cached_pages"], fresh["queries"], fresh["hits"]) == (0, 0, 0)
    prefixes = {"-".join(n.split("-")[:3]) for n in shm_segments(daemon.proc.pid)}
    assert len(prefixes) == 1, prefixes  # only the new engine group's rings and counters
    assert complete(daemon, work[1]) == oracle[1]
    assert complete(daemon, work[1]) == oracle[1]  # now from the new engines' caches
    assert idle_engines(daemon)[1]["prefix_cache"]["hits"] > 0
