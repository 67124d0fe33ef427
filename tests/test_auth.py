"""API keys, the refusal log and TLS files, without engines; and what `--check` and a
start beyond loopback say about them.

The keys' sources and their errors (which name the source and the line, never a key),
the comparison (every key's digest, whichever matches), the bounded per-client log of
refusals under a fake clock, and each TLS file mistake named at start.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives import serialization

from trd.config_reader import ConfigError
from trd.daemon import EXIT_CONFIG
from trd.daemon import main as daemon_main
from trd.frontend import auth
from trd.frontend.app import openai_errors
from trd.frontend.auth import ApiKeys, load_keys, protect
from trd.frontend.refusals import OTHERS, RefusalLog
from trd.frontend.tls import server_context

from daemon_fixture import launch_daemon, write_config
from tls_certs import make_ca

KEYS = ["first-key-0123456789", "second-key-0123456789", "third-key-0123456789"]


def test_keys_come_from_the_file_and_both_variables(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_bytes(f"\r\n  {KEYS[0]}\t\r\n\n{KEYS[1]}\n".encode())
    keys = load_keys(path, {"TRD_API_KEY": f"{KEYS[2]}\n", "VLLM_API_KEY": KEYS[0]})
    assert len(keys) == 3  # KEYS[0] twice counts once
    assert keys.sources == (str(path), "$TRD_API_KEY", "$VLLM_API_KEY")
    assert all(keys.accepts(k.encode()) for k in KEYS)
    for near in [KEYS[0][:-1], KEYS[0] + " ", KEYS[0] + "\n", KEYS[0].upper(), "".join(KEYS)]:
        assert not keys.accepts(near.encode())
    assert not any(k in repr(keys) for k in KEYS)
    assert len(load_keys(None, {"TRD_API_KEY": ""})) == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{KEYS[0]}\nshort-key\n", "line 2: a key must be 16 or more visible ASCII"),
        (f"{KEYS[0]} {KEYS[1]}\n", "line 1: a key must be"),
        ("\n \n", "no key in it"),
        (f"{KEYS[0]}é\n".encode(), "not ASCII text"),
    ],
)
def test_a_bad_key_file_names_itself_and_the_line(
    tmp_path: Path, text: str | bytes, message: str
) -> None:
    path = tmp_path / "keys"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(ConfigError) as err:
        load_keys(path, {})
    assert str(err.value).startswith(f"api_key_file: {str(path)!r}: {message}")
    assert "short-key" not in str(err.value) and KEYS[0] not in str(err.value)


def test_an_unreadable_key_file_or_a_bad_variable_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"api_key_file: '.*/none': cannot read it: No such"):
        load_keys(tmp_path / "none", {})
    with pytest.raises(ConfigError) as err:
        load_keys(None, {"VLLM_API_KEY": "token-abc123"})  # vLLM's docs' example: too short
    assert str(err.value).startswith("VLLM_API_KEY: '<hidden>': line 1: a key must be 16")
    assert "abc123" not in str(err.value)


def test_every_key_is_compared_whichever_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fixed-length digests, all of them compared: no early exit tells which key matched."""
    keys = ApiKeys([f"key-{i}-0123456789abcdef" for i in range(5)])
    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    for sent in [b"key-0-0123456789abcdef", b"key-4-0123456789abcdef", b"x", b"y" * 4000]:
        compared.clear()
        keys.accepts(sent)
        assert compared == [(32, 32)] * 5


async def empty(request: web.Request) -> web.Response:
    return web.json_response({})


async def statuses(metrics_need_key: bool, key: str) -> dict[str, int]:
    """GET each path of an app guarded by `protect`, on a real aiohttp server."""
    app = web.Application(middlewares=[openai_errors])
    for path in ["/health", "/metrics", "/v1/models"]:
        app.router.add_get(path, empty)
    protect(app, ApiKeys(KEYS[:1]), metrics_need_key, RefusalLog())
    async with TestClient(TestServer(app)) as client:
        out = {}
        for path in ["/health", "/metrics", "/v1/models", "/nowhere"]:
            resp = await client.get(path, headers={"Authorization": f"Bearer {key}"})
            out[path] = resp.status
        return out


def test_api_key_metrics_closes_metrics_and_nothing_else() -> None:
    wrong = "wrong-key-0123456789"
    assert asyncio.run(statuses(False, wrong)) == {
        "/health": 200, "/metrics": 200, "/v1/models": 401, "/nowhere": 401
    }  # fmt: skip
    assert asyncio.run(statuses(True, wrong))["/metrics"] == 401
    assert asyncio.run(statuses(True, KEYS[0])) == {
        "/health": 200, "/metrics": 200, "/v1/models": 200, "/nowhere": 404
    }  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refused_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "trd.auth"]


def test_a_client_is_logged_once_per_interval_with_the_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = RefusalLog(every_s=60, clock=clock)
    with caplog.at_level(logging.WARNING, "trd.auth"):
        for _ in range(100):
            log.refused("10.0.0.7", "wrong key", "POST /v1/completions")
            clock.now += 0.1
        assert len(refused_lines(caplog)) == 1
        clock.now += 60
        log.refused("10.0.0.7", "no key", "GET /v1/models")
    first, *rest = refused_lines(caplog)
    assert 'client=10.0.0.7 reason="wrong key"' in first and "since_last_line=0" in first
    assert len(rest) == 1 and "refused_since_last_line=99" in "".join(rest)


def test_the_client_table_is_bounded(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = RefusalLog(every_s=60, max_clients=4, clock=clock)
    with caplog.at_level(logging.WARNING, "trd.auth"):
        for i in range(1000):  # an attacker with many addresses, within one interval
            log.refused(f"10.0.{i // 256}.{i % 256}", "wrong key", "GET /v1/models")
        assert len(log.clients) == 4
        lines = refused_lines(caplog)
        assert len(lines) == 5 and OTHERS in lines[-1]
        clock.now += 61
        log.refused("10.9.9.9", "wrong key", "GET /v1/models")
    assert len(log.clients) == 1
    others, last = refused_lines(caplog)[-2:]
    assert OTHERS in others and "refused_since_last_line=995" in others
    assert "client=10.9.9.9" in last


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return make_ca(tmp_path_factory.mktemp("certs"))


def test_tls_files_are_checked_at_start(certs: Any, tmp_path: Path) -> None:
    assert server_context(None, None) is None
    assert server_context(certs.cert, certs.key) is not None
    cases = [
        ((tmp_path / "no.pem", certs.key), "ssl_certfile: '.*/no.pem': cannot read it: No such"),
        ((certs.cert, tmp_path / "no.pem"), "ssl_keyfile: '.*/no.pem': cannot read it: No such"),
        ((certs.cert, None), "ssl_certfile: TLS needs both ssl_certfile and ssl_keyfile"),
        ((None, certs.key), "ssl_keyfile: TLS needs both"),
        ((certs.key, certs.cert), "ssl_certfile: '.*server-key.pem': with ssl_keyfile "
                                  "'.*server.pem': not a PEM certificate and its"),
        ((certs.cert, certs.ca), "ssl_certfile: .*not a PEM certificate and its"),
    ]  # fmt: skip
    for (cert, key), message in cases:
        with pytest.raises(ConfigError, match=message):
            server_context(cert, key)


def test_an_encrypted_tls_key_is_refused_not_prompted_for(certs: Any, tmp_path: Path) -> None:
    key = serialization.load_pem_private_key(certs.key.read_bytes(), None)
    locked = tmp_path / "locked.pem"
    locked.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    ))  # fmt: skip
    with pytest.raises(ConfigError, match="its unencrypted private key"):
        server_context(certs.cert, locked)


def test_check_says_whether_keys_are_set_and_warns_beyond_loopback(
    tmp_path: Path,
    tiny_models: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = write_config(tmp_path, tiny_models, ["small"], listen="0.0.0.0:8123")
    monkeypatch.delenv("TRD_API_KEY", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert daemon_main(["--check", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "API keys: none set" in out and "TLS off" in out
    assert "warning: listening on 0.0.0.0:8123, beyond loopback, without an API key" in out
    monkeypatch.setenv("TRD_API_KEY", KEYS[0])
    assert daemon_main(["--check", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "API keys: 1 set ($TRD_API_KEY); /metrics open" in out and "warning" not in out
    assert KEYS[0] not in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--ssl-certfile", "/no/cert.pem", "--ssl-keyfile", "/no/key.pem"],
         "ssl_certfile: '/no/cert.pem': cannot read it"),
        (["--api-key-file", "/no/keys"], "api_key_file: '/no/keys': cannot read it"),
    ],
)  # fmt: skip
def test_a_missing_file_stops_the_start_naming_it(
    tmp_path: Path,
    tiny_models: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    message: str,
) -> None:
    config = write_config(tmp_path, tiny_models, ["small"])
    assert daemon_main(["--config", str(config), *flags]) == EXIT_CONFIG
    assert message in capsys.readouterr().err


def test_a_start_beyond_loopback_without_a_key_warns_naming_the_address(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    listen = "0.0.0.0:0"  # any free port
    config = write_config(tmp_path, tiny_models, ["small"], listen=listen)
    raw = yaml.safe_load(config.read_text())
    assert raw["listen"] == listen
    daemon = launch_daemon(config, {"TRD_API_KEY": "", "VLLM_API_KEY": ""})
    try:
        deadline = time.monotonic() + 60
        while f"listening on {listen}, beyond loopback" not in daemon.log():
            assert time.monotonic() < deadline and daemon.proc.poll() is None, daemon.log()
            time.sleep(0.2)
        assert "WARNING trd.daemon listening on" in daemon.log()
    finally:
        assert daemon.stop() == 0, daemon.log()
