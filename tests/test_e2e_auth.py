"""API keys and TLS on the real daemon's OpenAI endpoint, through the official openai client.

One daemon for the module: two keys from `--api-key-file` (a file with CRLF line ends and
blank lines), one from $TRD_API_KEY, HTTPS with a certificate from a CA made here. The
clients trust that CA only (the openai client through its httpx `http_client`): each key
gets completions, streamed and not, and chat; a wrong key is the SDK's
AuthenticationError. What an attacker would try is sent as raw headers: wrong keys, near
misses, header tricks; none may pass, none may reach the log, and the refusals must not
flood it.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx2
import openai
import pytest

from trd.cli import main as trctl

from daemon_fixture import Daemon, launch_daemon, wait_serving, write_config
from tls_certs import make_ca

NAMES = ["small", "large"]
FILE_KEYS = ["file-key-0123456789abcdef", "file-key-second-fedcba987654"]
ENV_KEY = "env-key-0123456789-ABCDEFGH"
KEY = FILE_KEYS[0]
NEAR_MISSES = [
    "wrong-key-0123456789abcdef",
    KEY[:-1],
    KEY + "x",
    KEY.upper(),
    " " + KEY[1:],
    ENV_KEY + KEY,
    FILE_KEYS[0] + FILE_KEYS[1],
    "x",  # a missing key: see "no header" below (the client refuses an empty one)
]


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]
) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("e2e_auth")
    certs = make_ca(tmp)
    keys = tmp / "api-keys"
    keys.write_bytes(f"{FILE_KEYS[0]}\r\n\r\n  {FILE_KEYS[1]}  \n".encode())
    config = write_config(tmp, tiny_models, NAMES, ssl_certfile=str(certs.cert),
                          ssl_keyfile=str(certs.key))  # fmt: skip
    env = {"TRD_API_KEY": ENV_KEY, "VLLM_API_KEY": ""}
    d = launch_daemon(config, env, ("--api-key-file", str(keys)))
    d.cafile = certs.ca
    yield wait_serving(d)
    assert d.stop() == 0, d.log()


def trust(d: Daemon) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=d.cafile)


def client(d: Daemon, key: str) -> openai.OpenAI:
    http = openai.DefaultHttpxClient(verify=trust(d), timeout=60)
    return openai.OpenAI(base_url=f"{d.url}/v1", api_key=key, max_retries=0, http_client=http)


def send(d: Daemon, path: str, headers: list[tuple[bytes, bytes]], method: str = "GET",
         body: object = None) -> httpx2.Response:  # fmt: skip
    with httpx2.Client(verify=trust(d), timeout=60) as c:
        return c.request(method, d.url + path, headers=headers, json=body)


def auth(value: str | bytes) -> list[tuple[bytes, bytes]]:
    return [(b"Authorization", value.encode() if isinstance(value, str) else value)]


def raw_status(d: Daemon, head: bytes) -> int:
    """The status of a GET /v1/models with the header lines `head`, sent byte for byte
    (httpx refuses to send several of them)."""
    start = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    with (
        socket.create_connection(("127.0.0.1", d.port), timeout=30) as sock,
        trust(d).wrap_socket(sock, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(start + head + b"\r\n")
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


K = KEY.encode()
# (the header lines as sent, the status: 200 in, 401 refused, 400 not HTTP)
TRICKS = [
    ("no header", b"", 401),
    ("the key", b"Authorization: Bearer " + K + b"\r\n", 200),
    ("lowercase scheme", b"Authorization: bearer " + K + b"\r\n", 200),
    ("uppercase scheme", b"Authorization: BEARER " + K + b"\r\n", 200),
    ("lowercase header name", b"authorization: Bearer " + K + b"\r\n", 200),
    ("spaces after the scheme", b"Authorization: Bearer    " + K + b"\r\n", 200),
    ("spaces after the key", b"Authorization: Bearer " + K + b"   \r\n", 200),
    ("a tab instead of the space", b"Authorization: Bearer\t" + K + b"\r\n", 401),
    ("a bare LF ends the line", b"Authorization: Bearer " + K + b"\n", 400),
    ("the key and a NUL", b"Authorization: Bearer " + K + b"\x00\r\n", 400),
    ("folded onto a second line", b"Authorization: Bearer\r\n " + K + b"\r\n", 400),
    ("no scheme", b"Authorization: " + K + b"\r\n", 401),
    ("scheme only", b"Authorization: Bearer\r\n", 401),
    ("scheme and a space", b"Authorization: Bearer \r\n", 401),
    ("empty header", b"Authorization:\r\n", 401),
    ("Basic with the key", b"Authorization: Basic " + K + b"\r\n", 401),
    ("key twice", b"Authorization: Bearer " + K + b" " + K + b"\r\n", 401),
    ("two headers, both right", (b"Authorization: Bearer " + K + b"\r\n") * 2, 401),
    ("two headers, one right",
     b"Authorization: Bearer " + K + b"\r\nAuthorization: Bearer nope-0123456789abcd\r\n", 401),
    ("non-ASCII key (UTF-8)", b"Authorization: Bearer " + K + "é".encode() + b"\r\n", 401),
    ("non-ASCII key (Latin-1)", b"Authorization: Bearer " + K + b"\xe9\r\n", 401),
    ("a key in another header", b"X-Api-Key: " + K + b"\r\n", 401),
]  # fmt: skip


@pytest.mark.parametrize(("head", "status"), [t[1:] for t in TRICKS], ids=[t[0] for t in TRICKS])
def test_header_tricks(daemon: Daemon, head: bytes, status: int) -> None:
    assert raw_status(daemon, head) == status


def test_a_refusal_is_openai_shaped_and_says_how_to_authenticate(daemon: Daemon) -> None:
    resp = send(daemon, "/v1/models", auth("Bearer wrong-key-0123456789abcdef"))
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "invalid_api_key"
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("path", ["/health", "/ready", "/version", "/metrics"])
def test_probes_and_metrics_are_open(daemon: Daemon, path: str) -> None:
    assert send(daemon, path, []).status_code == 200


@pytest.mark.parametrize(
    ("method", "path", "body", "with_key"),
    [
        ("POST", "/tokenize", {"prompt": "def f("}, 200),
        ("POST", "/detokenize", {"tokens": [1, 2]}, 200),
        ("GET", "/v1/models/small+large", None, 200),
        ("GET", "/no/such/route", None, 404),  # which routes exist is not said without a key
        ("GET", "/health/", None, 404),
        ("GET", "/%68ealth", None, 200),  # percent-decoded: /health itself
    ],
)
def test_every_other_route_needs_a_key(
    daemon: Daemon, method: str, path: str, body: object, with_key: int
) -> None:
    body = {"model": daemon.model, **body} if isinstance(body, dict) else None
    without = send(daemon, path, [], method, body).status_code
    assert without == (200 if path == "/%68ealth" else 401)
    assert send(daemon, path, auth(f"Bearer {KEY}"), method, body).status_code == with_key


def test_clients_that_do_not_trust_the_ca_or_speak_plain_http_fail(daemon: Daemon) -> None:
    untrusting = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.APIConnectionError):
        untrusting.models.list()
    plain = openai.OpenAI(base_url=f"http://127.0.0.1:{daemon.port}/v1", api_key=KEY,
                          max_retries=0)  # fmt: skip
    with pytest.raises(openai.APIConnectionError):
        plain.models.list()
    assert client(daemon, KEY).models.list().data  # still serving


def test_trctl_reaches_the_admin_socket(daemon: Daemon, capsys: pytest.CaptureFixture[str]) -> None:
    """The admin API keeps its own guard (admin_token) on its unix socket: no API key."""
    assert trctl(["--admin", daemon.admin, "status"]) == 0
    assert "serving" in capsys.readouterr().out


def test_engine_processes_do_not_inherit_the_key_variables(daemon: Daemon) -> None:
    pids = [e["pid"] for e in daemon.status()["engines"]]
    assert len(pids) == len(NAMES)
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert not [v for v in environ if v.startswith((b"TRD_API_KEY=", b"VLLM_API_KEY="))]


def refusal_lines(d: Daemon) -> list[str]:
    return [line for line in d.log().splitlines() if "trd.auth refused" in line]


def test_a_client_refused_many_times_is_logged_once_per_interval(daemon: Daemon) -> None:
    before = len(refusal_lines(daemon))
    for _ in range(30):
        assert (
            send(daemon, "/v1/models", auth("Bearer wrong-key-0123456789abcdef")).status_code == 401
        )
    lines = refusal_lines(daemon)
    assert lines and "client=127.0.0.1" in lines[0]
    assert len(lines) - before <= 1, "\n".join(lines)  # a new minute may start in the burst


@pytest.mark.parametrize("key", [*FILE_KEYS, ENV_KEY], ids=["file key 1", "file key 2", "env key"])
def test_each_key_gets_completions_over_tls_through_the_sdk(daemon: Daemon, key: str) -> None:
    api = client(daemon, key)
    done = api.completions.create(model=daemon.model, prompt="def f(", max_tokens=4,
                                  temperature=0)  # fmt: skip
    assert done.usage is not None and done.usage.completion_tokens == 4
    chunks = list(api.completions.create(model=daemon.model, prompt="def f(", max_tokens=4,
                                         temperature=0, stream=True))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.choices[0].text
    chat = api.chat.completions.create(model=daemon.model, max_tokens=3,
                                       messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    assert chat.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("stream", [False, True])
def test_a_wrong_key_is_the_sdks_authentication_error(daemon: Daemon, stream: bool) -> None:
    api = client(daemon, NEAR_MISSES[0])
    with pytest.raises(openai.AuthenticationError) as refused:
        api.completions.create(model=daemon.model, prompt="def f(", max_tokens=4, stream=stream)
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"


def test_no_key_and_nothing_sent_reaches_the_log(daemon: Daemon) -> None:
    """Every key and every near miss is sent here first (so no other test need come
    before); none of them may be in the log."""
    for key in [*FILE_KEYS, ENV_KEY, *NEAR_MISSES]:
        assert send(daemon, "/v1/models", auth(f"Bearer {key}")).status_code in (200, 401)
    log = daemon.log()
    assert "refused" in log and "https://" in log
    for secret in [*FILE_KEYS, ENV_KEY, *[k for k in NEAR_MISSES if len(k) >= 8]]:
        assert secret not in log
