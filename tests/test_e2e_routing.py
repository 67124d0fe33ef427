"""A request's own routing and priority through the real daemon (two engine processes,
float64, R-Stitch, the large model verifying the small one's proposals for the requests
pinned to it) and the official openai client (`extra_body`).

Each routing gives the reference loop's tokens and producers (a share held within the
request, a threshold of its own, one model for every token, and none: the daemon's
`policy.request_large_share`) streamed or not, several clients at once; each choice
reports who wrote it and /metrics counts its share; a routing the daemon cannot honour is
a 400 naming the field. Priority: with the large
engine stopped (SIGSTOP) while four requests wait for their handoff to it, it admits them
by priority, ties by arrival (one at a time: engine.max_batch_size 1), whatever order they
came in; the daemon's log shows the order they finished in.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from transformers import AutoTokenizer

from trd.policies.params import PolicySpec
from trd.protocol import RoutingParams, SamplingParams
from trd.testing.reference import ReferenceRouter

from daemon_fixture import Daemon, launch_daemon, wait_serving, write_config

NAMES = ["small", "large"]
DEFAULT_SHARE = 0.5  # what a request without `routing` holds within itself
POLICY: dict[str, Any] = {"name": "rstitch", "threshold": 0.78,
                          "request_large_share": DEFAULT_SHARE}  # fmt: skip
PROMPTS = ["def parse(", "The quick brown fox", "import os\n\n"]
MAX_TOKENS = 24
ROUTINGS: dict[str, dict[str, Any]] = {
    "share": {"large_share": 0.3},
    "threshold": {"threshold": 0.9},
    "large": {"model": "large"},
    "small": {"model": "small"},
    "policy": {"threshold": POLICY["threshold"]},  # the daemon's threshold, asked for
    "default": {},  # no routing field at all: the daemon's request_large_share
}
Expected = dict[tuple[str, str], tuple[str, dict[str, int]]]


@pytest.fixture(scope="module")
def launched(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]
) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("e2e_routing")
    engine = {"threads": 1, "max_batch_size": 1, "max_batch_tokens": 512}
    config = write_config(tmp, tiny_models, NAMES, "float64", policy=POLICY, engine=engine)
    # The large model verifies the small one's proposals: what it writes is still its own
    raw = yaml.safe_load(config.read_text())
    raw["models"][1]["draft"] = "small"
    config.write_text(yaml.safe_dump(raw))
    d = launch_daemon(config)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture(scope="module")
def oracle(launched: Daemon, tiny_models: dict[str, Path]) -> Expected:
    """Text and tokens per model of each prompt under each routing, while the daemon loads."""
    tok = AutoTokenizer.from_pretrained(tiny_models["small"])
    policy = PolicySpec(POLICY["name"], {"threshold": POLICY["threshold"]})
    ref = ReferenceRouter([tiny_models[n] for n in NAMES], policy)
    out: Expected = {}
    for name, routing in ROUTINGS.items():
        own = {**routing, "model": NAMES.index(routing["model"])} if "model" in routing else routing
        own = own or {"large_share": DEFAULT_SHARE}
        params = SamplingParams(MAX_TOKENS, ignore_eos=True, routing=RoutingParams(**own))
        for prompt in PROMPTS:
            trace = ref.run(tok.encode(prompt), params)
            counts = {n: trace.models.count(i) for i, n in enumerate(NAMES)}
            out[name, prompt] = str(tok.decode(trace.tokens)), counts
    return out


@pytest.fixture(scope="module")
def daemon(launched: Daemon, oracle: Expected) -> Daemon:
    return wait_serving(launched)


def complete(d: Daemon, prompt: str, stream: bool, **body: Any) -> tuple[str, dict[str, Any]]:
    """The text and the one choice's routing fields (a stream: its last chunk's)."""
    kw: dict[str, Any] = {"model": d.model, "prompt": prompt, "max_tokens": MAX_TOKENS}
    kw["temperature"] = 0
    extra = {"ignore_eos": True, **{k: v for k, v in body.items() if v != {}}}
    if not stream:
        resp = d.client().completions.create(**kw, extra_body=extra)
        return resp.choices[0].text, resp.choices[0].model_extra or {}
    chunks = list(d.client().completions.create(**kw, extra_body=extra, stream=True))
    return "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].model_extra or {}


def test_every_routing_gives_the_oracle_s_tokens_and_reports_them(
    daemon: Daemon, oracle: Expected
) -> None:
    jobs = [(name, p, s) for name in ROUTINGS for p in PROMPTS for s in (False, True)]

    def run(job: tuple[str, str, bool]) -> tuple[str, dict[str, Any]]:
        name, prompt, stream = job
        return complete(daemon, prompt, stream, routing=ROUTINGS[name])

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, jobs))
    for (name, prompt, stream), (text, info) in zip(jobs, results, strict=True):
        want_text, want_counts = oracle[name, prompt]
        assert text == want_text, (name, prompt, stream)
        assert info["tokens_per_model"] == want_counts, (name, prompt, stream)
        assert info["large_share"] == want_counts["large"] / MAX_TOKENS
    # The large model's requests were speculated: proposals verified, most accepted
    large = engine(daemon, "large")
    assert large["proposed"] > 0 and large["accepted"] > 0
    pinned = {n: oracle[n, p][1] for n in ("large", "small") for p in PROMPTS}
    assert pinned == {"large": {"small": 0, "large": MAX_TOKENS},
                      "small": {"small": MAX_TOKENS, "large": 0}}  # fmt: skip
    assert any(0 < oracle["share", p][1]["large"] < MAX_TOKENS for p in PROMPTS)
    # A request without routing holds the daemon's share, not the policy's threshold alone
    default = [oracle["default", p][1]["large"] for p in PROMPTS]
    assert default != [oracle["policy", p][1]["large"] for p in PROMPTS]
    assert all(abs(n - DEFAULT_SHARE * MAX_TOKENS) <= 3 for n in default), default
    _, text = daemon.get("/metrics")
    count = re.search(r"^trd_request_large_share_count (\S+)$", text, re.M)
    assert count is not None and float(count.group(1)) >= len(jobs)
    assert re.search(r'^trd_request_large_share_bucket\{le="1.0"\} ', text, re.M)


@pytest.mark.parametrize(
    ("routing", "param", "part"),
    [
        ({"model": "huge"}, "routing.model", '"huge" is not served (small, large)'),
        ({"threshold": 1.5}, "routing.threshold", "must be in [0, 1] for rstitch"),
        ({"large_share": 0}, "routing.large_share", "greater than 0"),
        ({"share": 0.2}, "routing.share", "Extra inputs are not permitted"),
    ],
)
def test_a_routing_the_daemon_cannot_honour_is_a_400_naming_it(
    daemon: Daemon, routing: dict[str, Any], param: str, part: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        complete(daemon, PROMPTS[0], False, routing=routing)
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == param and part in body["message"]
    assert complete(daemon, PROMPTS[0], False)[0]  # and it serves on


def engine(d: Daemon, name: str) -> dict[str, Any]:
    return next(e for e in d.status()["engines"] if e["name"] == name)


def test_the_large_engine_admits_waiting_handoffs_by_priority(daemon: Daemon) -> None:
    """Threshold 0 hands every position to the large model: each request waits for its
    handoff there. They come in at priorities 2, 0, 1, 0; the large engine, stopped until
    all four wait, takes them 0, 0 (in arrival order), 1, 2."""
    priorities = [2, 0, 1, 0]
    large = engine(daemon, "large")["pid"]
    os.kill(large, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(len(priorities)) as pool:
            futures = []
            for i, priority in enumerate(priorities):
                body = {"routing": {"threshold": 0.0}, "priority": priority}
                futures.append(pool.submit(request_id, daemon, PROMPTS[i % 3], body))
                wait_for(lambda n=i + 1: engine(daemon, "small")["pending"] == n)
            os.kill(large, signal.SIGCONT)
            ids = [f.result() for f in futures]
    finally:
        os.kill(large, signal.SIGCONT)
    finished = re.findall(r"request id=(cmpl-[0-9a-f]+) endpoint=completions", daemon.log())
    order = [ids.index(i) for i in finished if i in ids]
    assert order == [1, 3, 2, 0], [priorities[i] for i in order]


def request_id(d: Daemon, prompt: str, body: dict[str, Any]) -> str:
    kw: dict[str, Any] = {"model": d.model, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    resp = d.client().completions.create(**kw, extra_body={"ignore_eos": True, **body})
    assert (resp.model_extra or {})["tokens_per_model"] == {"small": 0, "large": 8}
    return resp.id


def wait_for(ready: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "the requests did not reach the large engine's queue"
        time.sleep(0.1)
