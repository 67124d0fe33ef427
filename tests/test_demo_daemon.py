"""`tokenrouterd --demo`, as the README's first command runs it: the real pair
(SmolLM2-135M-Instruct and its built partner, R-Stitch), asked through the openai client.

The pair is imported and built into the test cache once per CI run (minutes, the
`ensure_demo_pair` the daemon itself calls), so the daemon starts from the cache here.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from openai.types.chat import ChatCompletionMessageParam
from transformers import AutoTokenizer

from trd.demo.pair import DemoPair, ensure_demo_pair

from daemon_fixture import REPO_ROOT, Daemon, free_port, wait_serving

CACHE_DIR = REPO_ROOT / ".cache"
# The first test of a fresh checkout waits for the pair's build, which conftest.py starts
# when the run begins (about 7 minutes on 2 quiet cores, longer beside other tests).
pytestmark = [pytest.mark.timeout(1800), pytest.mark.demo_pair]
ASK = "What is the capital of France?"
QUESTION: list[ChatCompletionMessageParam] = [{"role": "user", "content": ASK}]


@pytest.fixture(scope="module")
def pair() -> DemoPair:
    return ensure_demo_pair("smollm2", CACHE_DIR)


@pytest.fixture(scope="module")
def demo(pair: DemoPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("demo") / "daemon.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trd.daemon", "--demo", "--port", str(port)],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
        )  # fmt: skip
    config = {
        "listen": f"127.0.0.1:{port}",
        "admin": f"127.0.0.1:{port + 1}",
        "models": [{"name": "small"}, {"name": "large"}],
    }
    daemon = wait_serving(Daemon(proc, config, log_path, log_path))
    yield daemon
    assert daemon.stop() == 0


def prompt_tokens(pair: DemoPair) -> int:
    """The question's length through the large model's chat template, by transformers."""
    tok = AutoTokenizer.from_pretrained(pair.models["large"])
    question = [{"role": "user", "content": ASK}]  # QUESTION, as transformers types it
    text = tok.apply_chat_template(question, add_generation_prompt=True, tokenize=False)
    return len(tok.encode(text, add_special_tokens=False))


def test_demo_answers_a_chat_question_on_topic(demo: Daemon, pair: DemoPair) -> None:
    client = demo.client(timeout=120)
    resp = client.chat.completions.create(
        model="small+large", messages=QUESTION, max_tokens=32, temperature=0,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    text = resp.choices[0].message.content or ""
    # On topic, though at the demo's quarter of large tokens not right: the 2-layer
    # partner agrees with the large model on a third of tokens (docs/demo.md; the large
    # model alone, and the pair at ~70% large tokens, answer "... is Paris.").
    assert "capital" in text and "Fren" in text, text
    extra = resp.choices[0].model_extra or {}
    assert resp.usage is not None
    assert resp.usage.completion_tokens == len(extra["token_ids"])
    assert resp.usage.prompt_tokens == prompt_tokens(pair)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    counts = (resp.model_extra or {})["tokens_per_model"]
    assert sum(counts.values()) == resp.usage.completion_tokens
    assert counts["large"] > 0 and counts["small"] > 0  # both models wrote

    stream = client.chat.completions.create(
        model="small+large", messages=QUESTION, max_tokens=32, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces) == text  # greedy: the stream says the same, byte for byte
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        resp.usage.prompt_tokens, resp.usage.completion_tokens,
    )  # fmt: skip
