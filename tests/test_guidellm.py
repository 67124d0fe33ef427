"""guidellm (the vLLM project's load tester) against a real daemon on the tiny fixtures.

Streaming completions and non-streaming chat, four requests at a time: every request
must succeed, and the token counts guidellm records must be the true ones: the prompt
as the fixture tokenizer counts the exact text guidellm sent, the output exactly the
max_tokens it asked for (guidellm sends ignore_eos), and the sums what the daemon's own
counters added up. guidellm is in the dev extras: a missing install fails here, it
does not skip. The guidellm runs are the slow tier (`pytest -m slow`); per commit, the
openai client's end-to-end tests check the same token counts (test_e2e_openai.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from daemon_fixture import Daemon, start_daemon, write_config


def test_guidellm_is_installed() -> None:
    """A dev install has it (pyproject's dev extra): the slow tier's runs cannot skip."""
    assert importlib.util.find_spec("guidellm") is not None, "pip install -e '.[dev]'"


REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 12, 32, 16


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]
) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("guidellm")
    d = start_daemon(write_config(tmp, tiny_models, ["small", "large"], max_inflight=16))
    yield d
    assert d.stop() == 0, d.log()


def counters(d: Daemon) -> dict[str, float]:
    """The daemon's own totals: finished requests, prompt and generated tokens."""
    out = {"requests": 0.0, "prompt": 0.0, "output": 0.0}
    names = {"trd_requests_total": "requests", "trd_prompt_tokens_total": "prompt",
             "trd_generated_tokens_total": "output"}  # fmt: skip
    for family in text_string_to_metric_families(d.get("/metrics")[1]):
        for s in family.samples:
            if s.name in names:
                out[names[s.name]] += s.value
    return out


def guidellm(d: Daemon, tokenizer: Path, out: Path, endpoint: str, stream: bool) -> dict[str, Any]:
    """One guidellm run; its JSON report's benchmark."""
    backend = (f"kind=openai_http,target={d.url},model={d.model},request_format={endpoint},"
               f"stream={str(stream).lower()}")  # fmt: skip
    data = f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}"
    argv = [
        sys.executable, "-m", "guidellm", "run", "--backend", backend,
        "--profile", "kind=concurrent,streams=4",
        "--constraint", f"kind=max_requests,count={REQUESTS}",
        "--data", data,
        "--tokenizer", f"kind=hf_auto,model={tokenizer}",
        "--output", f"kind=json,path={out}", "--disable-console",
    ]  # fmt: skip
    # Offline: the tokenizer is the fixture folder; caches stay in the test's folder.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(out.parent / "hf")}
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (bench,) = json.loads(out.read_text())["benchmarks"]
    return dict(bench)


def expected_prompt_tokens(tok: Any, body: dict[str, Any]) -> int:
    """What the fixture tokenizer counts for the prompt guidellm sent."""
    if "prompt" in body:
        return len(tok.encode(body["prompt"]))
    messages = [
        {"role": m["role"], "content": "".join(p["text"] for p in m["content"])}
        if isinstance(m["content"], list) else m
        for m in body["messages"]
    ]  # fmt: skip
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    return len(ids["input_ids"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("endpoint", "stream"), [("/v1/completions", True), ("/v1/chat/completions", False)]
)
def test_guidellm_requests_succeed_with_true_token_counts(
    daemon: Daemon, tokenizer_path: Path, tmp_path: Path, endpoint: str, stream: bool
) -> None:
    before = counters(daemon)
    bench = guidellm(daemon, tokenizer_path, tmp_path / "report.json", endpoint, stream)
    after = counters(daemon)
    reqs = bench["requests"]
    errors = [r["info"]["error"] for r in reqs["errored"] + reqs["incomplete"]]
    assert (len(reqs["successful"]), errors) == (REQUESTS, [])
    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    prompt = output = 0
    for r in reqs["successful"]:
        body = json.loads(r["request_args"])["body"]
        assert ("stream" in body) == stream
        asked = body.get("max_tokens") or body["max_completion_tokens"]
        got_in, got_out = r["input_metrics"]["text_tokens"], r["output_metrics"]["text_tokens"]
        assert asked == OUTPUT_TOKENS and body["ignore_eos"] is True
        assert (got_in, got_out) == (expected_prompt_tokens(tok, body), asked)
        if endpoint == "/v1/completions":
            assert got_in == PROMPT_TOKENS  # guidellm built the prompt to this many tokens
        prompt, output = prompt + got_in, output + got_out
    assert after["requests"] - before["requests"] == REQUESTS
    assert (after["prompt"] - before["prompt"], after["output"] - before["output"]) == (
        prompt, output
    )  # fmt: skip
