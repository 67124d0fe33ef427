"""The real daemon (two engine processes, float64) driven by the official openai client.

Greedy outputs must equal the routing oracle (trd.testing.reference) token for token: the text
and how many tokens each model produced; streamed text must equal non-streamed text;
all of it with several clients at once.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from openai.types.chat import ChatCompletionMessageParam
from transformers import AutoModelForCausalLM, AutoTokenizer

from trd import version
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.testing.reference import ReferenceRouter

from daemon_fixture import SCHEDULE, Daemon, launch_daemon, wait_serving, write_config
from engine_status import committed, fresh_engines, idle_engines

NAMES = ["small", "large"]
TOKEN = "test-admin-token-0123456789"
PROMPTS = ["def parse(", "The quick brown fox", "import os\n\n", "class Config:\n    "]
ASK = "Write a function that adds two numbers."
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": ASK}]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def launched(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]
) -> Iterator[Daemon]:
    """The daemon process, still loading its engines (the oracle runs meanwhile)."""
    tmp = tmp_path_factory.mktemp("e2e_openai")
    # A forward with every request on its engine takes the other core too: the oracle
    # comparisons below hold with that on.
    engine = {"threads": 1, "threads_alone": 2, "max_batch_tokens": 512}
    config = write_config(tmp, tiny_models, NAMES, "float64", admin_token=TOKEN, engine=engine)
    d = launch_daemon(config)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture(scope="module")
def daemon(launched: Daemon, oracle: dict[str, tuple[str, dict[str, int]]]) -> Daemon:
    return wait_serving(launched)


@pytest.fixture(scope="module")
def oracle(launched: Daemon, tiny_models: dict[str, Path]) -> dict[str, tuple[str, dict[str, int]]]:
    """Expected text and tokens per model for each prompt (and the chat) from the oracle.

    It depends on `launched` only to run while the daemon loads its engines."""
    tok = AutoTokenizer.from_pretrained(tiny_models["small"])
    policy = PolicySpec("scripted", {"schedule": SCHEDULE})
    ref = ReferenceRouter([tiny_models[n] for n in NAMES], policy)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    chat = [{"role": "user", "content": ASK}]  # CHAT, as transformers types it
    chat_text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    inputs = {p: tok.encode(p) for p in PROMPTS}
    inputs["<chat>"] = tok.encode(chat_text, add_special_tokens=False)
    out: dict[str, tuple[str, dict[str, int]]] = {}
    for key, ids in inputs.items():
        trace = ref.run(ids, params)
        counts = {n: trace.models.count(i) for i, n in enumerate(NAMES)}
        text = tok.decode(trace.tokens, skip_special_tokens=True)
        assert isinstance(text, str)  # one sequence of ids decodes to one string
        out[key] = (text, counts)
    return out


GREEDY: dict[str, Any] = {
    "temperature": 0,
    "max_tokens": MAX_TOKENS,
    "extra_body": {"ignore_eos": True},
}


def completion(d: Daemon, prompt: str, stream: bool) -> tuple[str, dict[str, Any]]:
    client = d.client()
    if not stream:
        r = client.completions.create(model=d.model, prompt=prompt, **GREEDY)
        extra = r.model_extra or {}
        return r.choices[0].text, {
            "usage": r.usage.model_dump(),
            **extra,
            "finish": r.choices[0].finish_reason,
        }
    chunks = list(
        client.completions.create(
            model=d.model,
            prompt=prompt,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    last = chunks[-1]
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    return text, {"usage": last.usage.model_dump(), **(last.model_extra or {}), "finish": finish[0]}


def chat(d: Daemon, stream: bool) -> tuple[str, dict[str, Any]]:
    client = d.client()
    if not stream:
        r = client.chat.completions.create(model=d.model, messages=CHAT, **GREEDY)
        extra = r.model_extra or {}
        return r.choices[0].message.content or "", {"usage": r.usage.model_dump(), **extra}
    chunks = list(
        client.chat.completions.create(
            model=d.model,
            messages=CHAT,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, {"usage": chunks[-1].usage.model_dump(), **(chunks[-1].model_extra or {})}


def test_concurrent_clients_get_the_oracle_output_streamed_or_not(
    daemon: Daemon, oracle: dict[str, tuple[str, dict[str, int]]]
) -> None:
    jobs = [(p, s) for p in PROMPTS for s in (False, True)] + [("<chat>", False), ("<chat>", True)]

    def run(job: tuple[str, bool]) -> tuple[str, dict[str, Any]]:
        key, stream = job
        return chat(daemon, stream) if key == "<chat>" else completion(daemon, key, stream)

    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(run, jobs))
    for (key, stream), (text, info) in zip(jobs, results, strict=True):
        want_text, want_counts = oracle[key]
        assert text == want_text, (key, stream)
        assert info["tokens_per_model"] == want_counts, (key, stream)
        assert all(want_counts[n] > 0 for n in NAMES), "the schedule must use every model"
        assert info["usage"]["completion_tokens"] == MAX_TOKENS
        assert info["usage"]["total_tokens"] == info["usage"]["prompt_tokens"] + MAX_TOKENS


def test_the_daemon_reports_the_ports_it_bound(daemon: Daemon) -> None:
    """Asked for port 0, the daemon serves on a port the OS picked and says which: in its
    ready file (what the launcher reads) and its log."""
    bound = daemon.bound()
    assert daemon.config["listen"] == "127.0.0.1:0" and bound is not None
    host, _, port = bound["listen"].rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0 and bound["pid"] == daemon.proc.pid
    assert bound["admin"] == daemon.config["admin"]  # a unix socket: no port to report
    assert f"on http://127.0.0.1:{port}, admin on {daemon.config['admin']}" in daemon.log()
    assert daemon.get("/health")[0] == 200


def test_bench_serve_measures_the_daemon_with_its_token_models(
    daemon: Daemon, oracle: dict[str, tuple[str, dict[str, int]]], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """`tokenrouterd bench serve` on the daemon: every column the stand-in server's run
    has (tests/test_bench_serve.py), the token-model ones filled in from the oracle's."""
    from trd.bench.identity import digest_text
    from trd.bench.serve import main as bench_serve

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = tmp_path / "result.json"
    argv = ["--base-url", daemon.url, "--endpoint", "completions", "--dataset", f"jsonl:{prompts}",
            "--num-prompts", str(len(PROMPTS)), "--max-tokens", str(MAX_TOKENS), "--ignore-eos",
            "--max-concurrency", "2", "--out", str(out)]  # fmt: skip
    assert bench_serve(argv) == 0
    run = json.loads(out.read_text())["runs"][0]
    s, by_prompt = run["summary"], {digest_text(p): p for p in PROMPTS}
    assert run["settings"]["model"] == "+".join(NAMES) and s["failed"] == 0
    assert s["output_tokens"] == len(PROMPTS) * MAX_TOKENS
    for rec in run["records"]:
        want_text, want_counts = oracle[by_prompt[rec["prompt"]]]
        assert rec["text"] == digest_text(want_text) and rec["tokens_per_model"] == want_counts
        assert [rec["producers"].count(str(i)) for i in range(2)] == [want_counts[n] for n in NAMES]
        assert rec["output"] is not None and rec["counted_by"] == "usage"
    large = sum(oracle[p][1]["large"] for p in PROMPTS)
    assert (s["large_model"], s["large_share"]) == ("large", large / s["output_tokens"])
    assert s["tokens_per_model"] == {n: sum(oracle[p][1][n] for p in PROMPTS) for n in NAMES}
    assert s["handoffs_per_request"] > 0 and s["identity"] is not None
    table = capsys.readouterr().out
    assert f"Large-token share:                {100 * s['large_share']:.1f}% (large)" in table


def test_eval_humaneval_records_the_daemons_token_models(daemon: Daemon, tmp_path: Path) -> None:
    """`tokenrouterd eval humaneval --limit 3` on the daemon: every completion judged, and
    each one's large-token share from the producers the daemon returned (the stand-in
    server without them: tests/test_eval_humaneval.py)."""
    from trd.evals.humaneval.run import main as humaneval

    out = tmp_path / "heval.json"
    argv = ["--base-url", daemon.url, "--limit", "3", "--max-tokens", "8", "--out", str(out)]
    assert humaneval(argv) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert [r["task_id"] for r in run["records"]] == [f"HumanEval/{i}" for i in range(3)]
    large = 0
    for rec in run["records"]:
        assert rec["verdict"] and rec["error"] is None and rec["counted_by"] == "usage"
        tokens = rec["output_tokens"]
        assert sum(rec["tokens_per_model"].values()) == tokens == len(rec["producers"])
        assert rec["large_share"] == rec["producers"].count("1") / len(rec["producers"])
        assert rec["large_share"] == rec["tokens_per_model"]["large"] / rec["output_tokens"]
        large += rec["tokens_per_model"]["large"]
    s = run["summary"]
    assert 0 < s["large_share"] == large / s["output_tokens"] and s["large_model"] == "large"


def test_stop_string_cuts_the_text_streamed_and_not(
    daemon: Daemon, oracle: dict[str, tuple[str, dict[str, int]]]
) -> None:
    full = oracle[PROMPTS[1]][0]
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    want = full[: full.index(stop)]
    client = daemon.client()
    r = client.completions.create(
        model=daemon.model, prompt=PROMPTS[1], stop=[stop, "\x00never"], **GREEDY
    )
    assert (r.choices[0].text, r.choices[0].finish_reason) == (want, "stop")
    chunks = list(
        client.completions.create(
            model=daemon.model, prompt=PROMPTS[1], stop=[stop], stream=True, **GREEDY
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"
    # vLLM's include_stop_str_in_output: the text ends with the stop string
    kept = full[: full.index(stop) + len(stop)]
    extra = {**GREEDY["extra_body"], "include_stop_str_in_output": True}
    args = {**GREEDY, "extra_body": extra}
    r = client.completions.create(model=daemon.model, prompt=PROMPTS[1], stop=[stop], **args)
    assert (r.choices[0].text, r.choices[0].finish_reason) == (kept, "stop")
    chunks = list(
        client.completions.create(
            model=daemon.model, prompt=PROMPTS[1], stop=[stop], stream=True, **args
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == kept


def test_n_choices_each_get_the_oracle_output_of_their_seed(
    daemon: Daemon, tiny_models: dict[str, Path]
) -> None:
    """n=3 with seed 41: choice i samples as the oracle does with seed 41 + i."""
    tok = AutoTokenizer.from_pretrained(tiny_models["small"])
    ref = ReferenceRouter(
        [tiny_models[n] for n in NAMES], PolicySpec("scripted", {"schedule": SCHEDULE})
    )
    ids = tok.encode(PROMPTS[2])
    want = []
    for i in range(3):
        sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, seed=41 + i, ignore_eos=True)
        want.append(tok.decode(ref.run(ids, sp).tokens, skip_special_tokens=True))
    assert len(set(want)) == 3  # else the test could not tell the choices apart
    client = daemon.client()
    args: dict[str, Any] = {
        "model": daemon.model, "prompt": PROMPTS[2], "n": 3, "temperature": 0.9, "seed": 41,
        "max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True},
    }  # fmt: skip
    r = client.completions.create(**args)
    assert [(c.index, c.text, c.finish_reason) for c in r.choices] == [
        (i, text, "length") for i, text in enumerate(want)
    ]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 3 * MAX_TOKENS)
    assert sum((r.model_extra or {})["tokens_per_model"].values()) == 3 * MAX_TOKENS
    chunks = list(
        client.completions.create(stream=True, stream_options={"include_usage": True}, **args)
    )
    texts, finishes = ["", "", ""], {}
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert texts == want and finishes == dict.fromkeys(range(3), "length")
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 3 * MAX_TOKENS


def test_logprobs_are_the_producing_models_own(
    daemon: Daemon, tiny_models: dict[str, Path]
) -> None:
    """Each token's log-probability and top 3 equal log_softmax of the model that made it,
    recomputed in full by transformers (float64 engines; the wire carries float32)."""
    client, prompt = daemon.client(), PROMPTS[0]
    extra = {"ignore_eos": True, "return_token_ids": True}
    args: dict[str, Any] = {"model": daemon.model, "prompt": prompt, "logprobs": 3,
                            "temperature": 0, "max_tokens": 12, "extra_body": extra}  # fmt: skip
    choice = client.completions.create(**args).choices[0]
    ids, names = (choice.model_extra or {})["token_ids"], (choice.model_extra or {})["token_models"]
    lp = choice.logprobs
    assert lp is not None and lp.token_logprobs is not None and lp.top_logprobs is not None
    tok = AutoTokenizer.from_pretrained(tiny_models["small"])
    models = {
        n: AutoModelForCausalLM.from_pretrained(tiny_models[n], dtype=torch.float64) for n in NAMES
    }
    context = tok.encode(prompt)
    for i, (token, name) in enumerate(zip(ids, names, strict=True)):
        with torch.no_grad():
            logits = models[name](torch.tensor([context + ids[:i]])).logits[0, -1]
        ref = torch.log_softmax(logits, dim=-1)
        assert lp.token_logprobs[i] == pytest.approx(ref[token].item(), abs=1e-5), i
        top = sorted(lp.top_logprobs[i].values(), reverse=True)  # greedy: the chosen is top 1
        assert top == pytest.approx(ref.topk(3).values.tolist(), abs=1e-5), i
    assert set(names) == set(NAMES)  # both models' values were checked
    # a stream's chunks carry the same values, each for the tokens its text came from
    chunks = list(client.completions.create(stream=True, **args))
    streamed = [v for c in chunks for v in (c.choices[0].logprobs.token_logprobs or [])]
    assert streamed == lp.token_logprobs
    # chat, as the openai client types it
    r = client.chat.completions.create(model=daemon.model, messages=CHAT, logprobs=True,
                                       top_logprobs=2, max_tokens=8, temperature=0)  # fmt: skip
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    assert content is not None and len(content) == 8
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob == e.logprob for e in content)


def test_models_health_and_metrics(daemon: Daemon) -> None:
    client = daemon.client()
    models = client.models.list()
    assert [m.id for m in models.data] == ["small+large"]
    card = client.models.retrieve("small+large")
    assert card == models.data[0] and (card.model_extra or {})["max_model_len"] == 512
    with pytest.raises(openai.NotFoundError, match='"gpt-4" does not exist'):
        client.models.retrieve("gpt-4")
    assert daemon.get("/version") == (200, {"version": version()})
    assert daemon.get("/health") == (200, {"status": "ok"})
    completion(daemon, PROMPTS[0], stream=False)  # one request alone: each model runs wide
    deadline = time.monotonic() + 30
    while set(produced(daemon)) != set(NAMES) or set(wide_forwards(daemon)) != set(NAMES):
        assert time.monotonic() < deadline, (produced(daemon), wide_forwards(daemon))
        time.sleep(0.2)
    _, text = daemon.get("/metrics")
    for name in (
        "trd_time_to_first_token_seconds_count",
        "trd_e2e_request_latency_seconds_count",
        "trd_kv_pages_used{",
        "trd_engine_queue_depth{",
        "trd_handoffs_total{",
    ):
        assert name in text, name


def produced(d: Daemon) -> dict[str, float]:
    """Models that have generated tokens, by the front end's counter."""
    return metric_by_model(d, "trd_generated_tokens_total")


def wide_forwards(d: Daemon) -> dict[str, float]:
    """Models with forwards on more threads than their share, by the engines' stats."""
    return metric_by_model(d, "trd_engine_wide_forwards_total")


def metric_by_model(d: Daemon, metric: str) -> dict[str, float]:
    """The positive values of a counter labelled by model, from /metrics."""
    status, text = d.get("/metrics")
    assert status == 200
    counts = {
        line.split('"')[1]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(metric + "{")
    }
    return {name: n for name, n in counts.items() if n > 0}


def raw_post(d: Daemon, path: str, body: bytes, timeout: float = 30) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        d.url + path, data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _body(**fields: Any) -> bytes:
    return json.dumps(
        {"model": "small+large", "prompt": "def f(", "max_tokens": 4, **fields}
    ).encode()


BAD = {
    "malformed json": (b'{"model": "small+large", "prompt": ', 400, None),
    "prompt of wrong type": (_body(prompt={"text": "x"}), 400, "prompt"),
    "max_tokens of wrong type": (_body(max_tokens="ten"), 400, "max_tokens"),
    "temperature out of range": (_body(temperature=7), 400, "temperature"),
    "unsupported value": (_body(echo=True), 400, "echo"),  # unknown fields are ignored
    "seed past the wire's i64": (_body(seed=2**63), 400, "seed"),
    "unknown model": (_body(model="gpt-5"), 404, "model"),
    "max_tokens zero": (_body(max_tokens=0), 400, "max_tokens"),
    "max_tokens negative": (_body(max_tokens=-3), 400, "max_tokens"),
    "prompt longer than the context": (_body(prompt=[5] * 600), 400, "prompt"),
    "prompt + max_tokens beyond the context": (
        _body(prompt=[5] * 500, max_tokens=50),
        400,
        "max_tokens",
    ),
    "100 stop strings": (_body(stop=[f"s{i}" for i in range(100)]), 400, "stop"),
    "n=0": (_body(n=0), 400, "n"),
    "10 MB body": (_body(prompt="x" * (10 << 20)), 413, None),
}


def test_bad_requests_get_openai_errors_while_a_good_stream_runs(
    daemon: Daemon, oracle: dict[str, tuple[str, dict[str, int]]]
) -> None:
    with ThreadPoolExecutor(1) as pool:
        good = pool.submit(completion, daemon, PROMPTS[0], True)
        for name, (body, status, param) in BAD.items():
            got, answer = raw_post(daemon, "/v1/completions", body)
            assert got == status, (name, answer)
            err = answer["error"]
            assert set(err) == {"message", "type", "param", "code"}, name
            assert err["message"] and err["param"] == param, (name, err)
        assert good.result(timeout=60)[0] == oracle[PROMPTS[0]][0]
    got, answer = raw_post(
        daemon,
        "/v1/chat/completions",
        json.dumps({"model": "small+large", "messages": "hi"}).encode(),
    )
    assert got == 400 and answer["error"]["param"] == "messages"
    with pytest.raises(openai.NotFoundError):
        daemon.client().chat.completions.create(model="nope", messages=CHAT)


def admin_status(d: Daemon) -> dict[str, Any]:
    return d.status()


@pytest.mark.parametrize("n", [1, 3])
def test_client_that_disconnects_mid_stream_frees_its_pages(daemon: Daemon, n: int) -> None:
    max_tokens = 400
    body = json.loads(
        _body(max_tokens=max_tokens, stream=True, ignore_eos=True, temperature=0, n=n)
    )
    payload = json.dumps(body).encode()
    log_from = len(daemon.log())
    before = committed(idle_engines(daemon))
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=30) as sock:
        head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        seen = b""
        while seen.count(b"data: ") < 3:
            seen += sock.recv(65536)
        assert admin_status(daemon)["active_requests"] == n  # one per choice
    left = time.time()
    # Stats stamped after the client left that show nothing held: the engines freed it.
    made = committed(idle_engines(daemon, since=left, timeout=15)) - before
    assert admin_status(daemon)["active_requests"] == 0
    # Aborted, not run to the end: the engines committed some of its tokens, not all.
    assert 3 <= made < n * max_tokens, made
    # An ordinary disconnect is one INFO line, not an ERROR with a traceback.
    log = daemon.log()[log_from:]
    lines = [line for line in log.splitlines() if "status=499" in line]
    assert lines and all(" INFO " in line for line in lines), lines
    assert "Traceback" not in log and " ERROR " not in log


def test_trctl_status_and_thresholds(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    from trd.cli import main

    CTL = ["--admin", daemon.admin, "--token", TOKEN]
    assert main(["--admin", daemon.admin, "status"]) == 1  # no token
    assert "401" in capsys.readouterr().err
    assert main(["--admin", daemon.admin, "--token", TOKEN, "status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert [(e["name"], e["dtype"], e["device"], e["state"]) for e in status["engines"]] == [
        ("small", "float64", "cpu", "ready"),
        ("large", "float64", "cpu", "ready"),
    ]
    assert status["engines"][1]["path"].endswith("large")
    assert status["policy"] == {"name": "scripted", "schedule": SCHEDULE}
    assert status["memory_plan"]["models"][0]["pages"] == status["engines"][0]["kv_pages_total"]
    assert main(["--config", str(daemon.config_path), "status"]) == 0  # address + token
    table = capsys.readouterr().out
    assert "small" in table and "large" in table and "memory plan:" in table
    assert main([*CTL, "thresholds", "--set", "large=1,2", "--max-wait-ms", "5"]) == 0
    capsys.readouterr()
    assert main([*CTL, "thresholds", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["models"]["large"] == {"set": [1, 2], "engine": [1, 2]}
    assert view["max_wait_ms"] == 5
    assert main([*CTL, "thresholds", "--set", "huge=1"]) == 1
    assert "no model 'huge'" in capsys.readouterr().err


def test_trctl_recommends_and_applies_thresholds_from_live_figures(
    daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    from trd.cli import main

    client = daemon.client()
    made = committed(idle_engines(daemon)) + MAX_TOKENS * len(PROMPTS)
    for prompt in PROMPTS:  # traffic, so both engines have step latencies and routes
        client.completions.create(model=daemon.model, prompt=prompt, **GREEDY)
    # Wait until every engine's published stats include that traffic (no fixed sleep).
    fresh_engines(daemon, time.time(), lambda engines: committed(engines) >= made)
    ctl = ["--admin", daemon.admin, "--token", TOKEN]
    assert main([*ctl, "thresholds", "--recommend", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert [row["n"] for row in rec["levels"]] == [1, 2, 4, 8, 16]
    for row in rec["levels"]:
        assert row["recommended"][0] == 1  # the entry model never waits
        assert sum(b - 1 for b in row["recommended"]) < row["n"]
    assert main([*ctl, "thresholds", "--recommend", "--apply"]) == 0
    out = capsys.readouterr().out
    assert "recommended table:" in out and out.rstrip().endswith("applied.")
    assert main([*ctl, "thresholds", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["models"]["large"]["set"] == rec["models"]["large"]
    assert main(["--admin", daemon.admin, "thresholds", "--apply"]) == 1
    assert "--apply goes with --recommend" in capsys.readouterr().err


def admin_call(d: Daemon, method: str, path: str, body: bytes, headers: dict[str, str]) -> Any:
    """A raw HTTP call to the admin unix socket: (status, JSON body)."""
    import http.client

    class Unix(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(d.admin.removeprefix("unix:"))

    conn = Unix("localhost", timeout=30)
    try:
        conn.request(method, path, body, headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_admin_api_refuses_web_pages_wrong_types_missing_tokens_and_huge_thresholds(
    daemon: Daemon,
) -> None:
    import os
    import stat

    mode = stat.S_IMODE(os.stat(daemon.admin.removeprefix("unix:")).st_mode)
    assert mode == 0o600, oct(mode)  # only the daemon's user may steer it
    auth = {"Authorization": f"Bearer {TOKEN}"}
    body = json.dumps({"thresholds": {"large": [1, 2]}}).encode()
    as_json = {"Content-Type": "application/json", **auth}
    # A "simple" cross-origin POST a web page can send: text/plain, with an Origin.
    for headers, status, code in [
        ({"Content-Type": "text/plain", **auth}, 415, "unsupported_media_type"),
        ({"Origin": "http://evil.example", **as_json}, 403, "forbidden"),
        ({"Content-Type": "application/json"}, 401, "unauthorized"),
        ({"Content-Type": "application/json", "Authorization": "Bearer wrong"}, 401, None),
    ]:
        got, answer = admin_call(daemon, "POST", "/thresholds", body, headers)
        assert got == status and (code is None or answer["error"]["code"] == code), answer
    assert admin_call(daemon, "GET", "/status", b"", {"Origin": "null", **auth})[0] == 403
    huge = json.dumps({"thresholds": {"large": [1, 1_000_000]}}).encode()
    got, answer = admin_call(daemon, "POST", "/thresholds", huge, as_json)
    assert got == 400 and "max_inflight" in answer["error"]["message"], answer
    assert admin_call(daemon, "GET", "/thresholds", b"", auth)[1]["models"]["large"]["set"] != [
        1,
        1_000_000,
    ]


EXTREME: list[dict[str, Any]] = [
    {"temperature": 1e-45, "seed": 1},
    {"temperature": 5e-324, "top_p": 1e-9},
    {"temperature": 2.0, "seed": 2**63 - 1, "extra_body": {"top_k": 2**31 - 1}},
    {"temperature": 1e-7, "top_p": 1.0, "extra_body": {"top_k": 1}},
    {"temperature": 0.3, "extra_body": {"min_tokens": MAX_TOKENS, "ignore_eos": True}},
]


def test_extreme_sampling_values_never_take_an_engine_down(
    daemon: Daemon, oracle: dict[str, tuple[str, dict[str, int]]]
) -> None:
    """Many extreme-but-valid requests beside good ones: nothing restarts, outputs exact."""
    before = admin_status(daemon)
    pids = [e["pid"] for e in before["engines"]]

    def extreme(i: int) -> str:
        kw = {"max_tokens": MAX_TOKENS, **EXTREME[i % len(EXTREME)]}
        r = daemon.client().completions.create(model=daemon.model, prompt=PROMPTS[i % 4], **kw)
        return r.choices[0].finish_reason

    with ThreadPoolExecutor(6) as pool:
        bad = [pool.submit(extreme, i) for i in range(20)]
        good = [pool.submit(completion, daemon, p, i % 2 == 0) for i, p in enumerate(PROMPTS)]
        assert all(f.result(timeout=300) in ("length", "stop") for f in bad)
        for prompt, fut in zip(PROMPTS, good, strict=True):
            text, info = fut.result(timeout=300)
            assert (text, info["tokens_per_model"]) == oracle[prompt]
    after = admin_status(daemon)
    assert after["restarts"] == before["restarts"]
    assert [e["pid"] for e in after["engines"]] == pids
    assert "Traceback" not in daemon.log()
