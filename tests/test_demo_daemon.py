"""`tokenrouterd --demo`, as the README's first command runs it: the Qwen2.5-Coder pair
(0.5B small in int8, 1.5B large in int4; the 1.5B verifying the 0.5B's proposals for each
request without routing, R-Stitch for a request that asks it), asked through the openai
client.

The pair is imported into the test cache once per CI run (the `ensure_demo_pair` the
daemon itself calls, started in the background by conftest.py), so the daemon starts
from the cache here. The oracle is the reference loop (`trd.testing.reference`: transformers,
full recomputation, one request) in the served dtype: run before the daemon starts and
freed, so that the two pairs of models are never in memory together.
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam
from transformers import AutoTokenizer

from trd.bench.server import launch
from trd.demo.pair import DEMO_QUANTIZATION, DemoPair, ensure_demo_pair
from trd.frontend.tokens import PromptEncoder
from trd.policies.params import PolicySpec
from trd.protocol import RoutingParams, SamplingParams
from trd.testing.reference import ReferenceRouter, Trace

from daemon_fixture import REPO_ROOT, Daemon, wait_serving

CACHE_DIR = REPO_ROOT / ".cache"
# The first test of a fresh checkout waits for the pair's import, which conftest.py starts
# when the run begins (2-4 minutes beside the other tests on 2 cores).
pytestmark = [pytest.mark.timeout(1800), pytest.mark.demo_pair, pytest.mark.slow]
FRANCE = "What is the capital of France?"
FIBONACCI = (
    "Write a Python function fib(n) that returns the n-th Fibonacci number, with fib(0) = 0"
    " and fib(1) = 1. Reply with the code only."
)
# Where the 0.5B is unsure (normalised entropy above tau), so the large model writes.
HASH_MAP = "Explain what a hash map is in two sentences."
# (question, tokens the reference loop makes, routed by R-Stitch): what the daemon's
# answers start with; not routed: the demo's default (the 1.5B's own tokens).
ORACLE = ((FRANCE, 24, False), (HASH_MAP, 32, False), (HASH_MAP, 32, True))
Key = tuple[str, bool]
CHECK_FIB = "\nassert [fib(n) for n in range(12)] == [0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89]\n"


@pytest.fixture(scope="module")
def pair() -> DemoPair:
    return ensure_demo_pair("qwen", CACHE_DIR, DEMO_QUANTIZATION["qwen"])  # what --demo serves


@pytest.fixture(scope="module")
def oracle(pair: DemoPair) -> dict[Key, Trace]:
    """The reference loop's answer to each ORACLE question (the demo's default: the large
    model alone where it speculates, else R-Stitch at its threshold with the demo's share;
    routed: R-Stitch at its threshold; greedy), computed before the daemon starts."""
    encoder = PromptEncoder(pair.models["large"])
    ref = ReferenceRouter(
        [pair.models["small"], pair.models["large"]],
        PolicySpec("rstitch", {"threshold": pair.threshold}),
        pair.dtype,
    )
    default = RoutingParams(model=1) if pair.speculate else RoutingParams(
        large_share=pair.request_share)  # fmt: skip
    traces = {
        (q, routed): ref.run(
            encoder.chat([{"role": "user", "content": q}]),
            SamplingParams(n, routing=RoutingParams() if routed else default),
        )
        for q, n, routed in ORACLE
    }
    del ref
    gc.collect()
    return traces


@pytest.fixture(scope="module")
def demo(
    oracle: dict[Key, Trace], pair: DemoPair, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Daemon]:
    folder = tmp_path_factory.mktemp("demo")
    started = launch("daemon", [sys.executable, "-m", "trd.daemon", "--demo", "--port", "0"],
                     folder)  # fmt: skip
    config = {"models": [{"name": "small"}, {"name": "large"}]}
    d = Daemon(started.name, started.proc, started.log_path, started.ready_file,
               health="/ready", config=config)  # fmt: skip
    # Loading 4.5 GB of weights into two engine processes: seconds alone, minutes beside
    # the rest of a 2-core CI run.
    daemon = wait_serving(d, timeout=600)
    yield daemon
    assert daemon.stop() == 0


def prompt_tokens(pair: DemoPair, question: str) -> int:
    """The question's length through the models' chat template, by transformers."""
    tok = AutoTokenizer.from_pretrained(pair.models["large"])
    text = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return len(tok.encode(text, add_special_tokens=False))


def ask(
    client: OpenAI,
    pair: DemoPair,
    oracle: dict[Key, Trace],
    question: str,
    max_tokens: int,
    routed: bool = False,
) -> tuple[str, dict[str, int]]:
    """The answer and the tokens each model wrote (`routed`: by R-Stitch at the demo's
    threshold, asked for), checked: usage exact, the stream says the same, and its first
    tokens and their producers are the reference loop's."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": question}]
    routing = {"routing": {"threshold": pair.threshold}} if routed else {}
    resp = client.chat.completions.create(
        model="small+large", messages=messages, max_tokens=max_tokens, temperature=0,
        extra_body={"return_token_ids": True, **routing},
    )  # fmt: skip
    text = resp.choices[0].message.content or ""
    extra = resp.choices[0].model_extra or {}
    assert resp.usage is not None
    assert resp.usage.completion_tokens == len(extra["token_ids"])
    assert resp.usage.prompt_tokens == prompt_tokens(pair, question)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    counts = (resp.model_extra or {})["tokens_per_model"]
    assert sum(counts.values()) == resp.usage.completion_tokens
    if (question, routed) in oracle:  # the reference loop's, token for token, producers too
        trace = oracle[question, routed]
        assert extra["token_ids"] == trace.tokens
        assert counts == {"small": trace.models.count(0), "large": trace.models.count(1)}

    stream = client.chat.completions.create(
        model="small+large", messages=messages, max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body=routing,
    )  # fmt: skip
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == text  # greedy: the stream says the same, byte for byte
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (
        resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens,
    )  # fmt: skip
    return text, counts


def test_demo_answers_paris(demo: Daemon, pair: DemoPair, oracle: dict[Key, Trace]) -> None:
    text, _ = ask(demo.client(timeout=300), pair, oracle, FRANCE, max_tokens=24)
    assert "Paris" in text, text


def test_demo_writes_a_fibonacci_function_that_runs(
    demo: Daemon, pair: DemoPair, oracle: dict[Key, Trace]
) -> None:
    text, _ = ask(demo.client(timeout=300), pair, oracle, FIBONACCI, max_tokens=160)
    blocks = re.findall(r"```(?:python)?\n(.*?)```", text, re.DOTALL)
    code = blocks[0] if blocks else text
    # The model's code runs in its own interpreter, with a time limit.
    done = subprocess.run(
        [sys.executable, "-I", "-c", code + CHECK_FIB], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, f"{text}\n---\n{done.stderr}"


def test_demo_routes_where_the_small_model_is_unsure(
    demo: Daemon, pair: DemoPair, oracle: dict[Key, Trace]
) -> None:
    _, counts = ask(demo.client(timeout=300), pair, oracle, HASH_MAP, 32, routed=True)
    assert counts["small"] > 0 and counts["large"] > 0, counts  # both models wrote
    # Without routing the 1.5B writes every token, the 0.5B's accepted proposals among them
    _, counts = ask(demo.client(timeout=300), pair, oracle, HASH_MAP, 32)
    assert counts == {"small": 0, "large": 32}, counts
    large = next(e for e in demo.status()["engines"] if e["name"] == "large")
    assert large["accepted"] > 0, large
