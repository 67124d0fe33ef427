"""Who may use the OpenAI endpoint: API keys, checked as vLLM's --api-key checks them.

The keys are the lines of the file `api_key_file` names (or `tokenrouterd --api-key-file`)
and of $TRD_API_KEY and $VLLM_API_KEY: one key per line, blank lines and the whitespace
around a key ignored, each 16+ visible ASCII characters. Any of them is accepted. With
at least one key, every route but the probes wants `Authorization: Bearer <key>`:

    open:      GET /health  /ready  /version  /metrics (`api_key_metrics: true` closes it)
    need a key: POST /v1/completions  /v1/chat/completions  GET /v1/models[/{model}]
               POST /tokenize  /detokenize  (vLLM leaves these two open; they render chat
               templates at the caller's request) and any path no route serves

A refusal is a 401 in OpenAI's error shape (the openai client raises AuthenticationError)
with `WWW-Authenticate: Bearer`. Only digests of the keys stay in memory: an HMAC-SHA256
under a random per-process secret. A request's token gets the same HMAC and is compared
with every key's digest (fixed length, no early exit), so the time taken says neither
which key nor how much of one matched. The keys are never logged, nor is what was sent.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler

from trd.config import Address, Config
from trd.config_reader import fail
from trd.frontend.openai_api import ApiError
from trd.frontend.refusals import RefusalLog, quiet_unparsable
from trd.frontend.tls import server_context

KEY_ENVS = ("TRD_API_KEY", "VLLM_API_KEY")
MIN_KEY_CHARS = 16
PROBES = ("/health", "/ready", "/version")


class ApiKeys:
    """The accepted keys, held as HMAC digests; `len()` says how many, `sources` whence."""

    def __init__(self, keys: Iterable[str], sources: tuple[str, ...] = ()) -> None:
        self._secret = secrets.token_bytes(32)
        self._digests = [self._digest(k.encode()) for k in dict.fromkeys(keys)]
        self.sources = sources

    def _digest(self, raw: bytes) -> bytes:
        return hmac.new(self._secret, raw, hashlib.sha256).digest()

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        return f"ApiKeys({len(self)} keys from {', '.join(self.sources) or 'nowhere'})"

    def accepts(self, token: bytes) -> bool:
        sent = self._digest(token)
        match = False
        for digest in self._digests:  # every one, whichever matches
            match |= hmac.compare_digest(sent, digest)
        return match


def parse_keys(key: str, shown: str, text: str) -> list[str]:
    """The keys in `text`, one per line; an error names `key`, `shown` and the line."""
    keys = []
    for n, line in enumerate(text.splitlines(), start=1):
        k = line.strip()
        if not k:
            continue
        if len(k) < MIN_KEY_CHARS or not all("!" <= c <= "~" for c in k):
            fail(key, shown, f"line {n}: a key must be {MIN_KEY_CHARS} or more visible ASCII "
                 "characters without spaces")  # fmt: skip
        keys.append(k)
    return keys


def load_keys(key_file: Path | None, env: Mapping[str, str] = os.environ) -> ApiKeys:
    """The keys of `key_file` and of the KEY_ENVS variables (an empty variable: none)."""
    keys, sources = [], []
    if key_file is not None:
        try:
            text = key_file.read_text(encoding="ascii")
        except OSError as exc:
            fail("api_key_file", str(key_file), f"cannot read it: {exc.strerror}")
        except UnicodeDecodeError:
            fail("api_key_file", str(key_file), "not ASCII text")
        found = parse_keys("api_key_file", str(key_file), text)
        if not found:  # meant to close the endpoint; an empty file must not leave it open
            fail("api_key_file", str(key_file), "no key in it")
        keys += found
        sources.append(str(key_file))
    for name in KEY_ENVS:
        found = parse_keys(name, "<hidden>", env.get(name, ""))
        if found:
            keys += found
            sources.append(f"${name}")
    return ApiKeys(keys, tuple(sources))


def bearer(request: web.Request) -> tuple[bytes | None, str]:
    """The token of the request's one `Authorization: Bearer` header, or None and why.

    The scheme is case-insensitive (RFC 7235) and may be followed by several spaces."""
    sent = request.headers.getall("Authorization", [])
    if not sent:
        return None, "no key"
    if len(sent) > 1:
        return None, "several Authorization headers"
    scheme, _, token = sent[0].partition(" ")
    token = token.lstrip(" ")
    if scheme.lower() != "bearer" or not token:
        return None, "not a bearer token"
    if not token.isascii():  # no key is: it cannot match, and has no bytes to compare
        return None, "wrong key"
    return token.encode(), "wrong key"


def protect(
    app: web.Application, keys: ApiKeys, metrics_need_key: bool, refusals: RefusalLog
) -> None:
    """Refuse every request to `app` without one of `keys`, but on the open paths.

    A route is open by the resource it resolved to, not by the path as sent."""
    open_paths = set(PROBES) | (set() if metrics_need_key else {"/metrics"})

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        if resource is not None and resource.canonical in open_paths:
            return await handler(request)
        token, why = bearer(request)
        if token is None or not keys.accepts(token):
            refusals.refused(request.remote or "unix", why, f"{request.method} {request.path}")
            err = ApiError(401, "Incorrect or missing API key: send Authorization: Bearer "
                           "<key>", code="invalid_api_key")  # fmt: skip
            err.headers["WWW-Authenticate"] = 'Bearer realm="tokenrouterd"'
            raise err
        return await handler(request)

    app.middlewares.append(check)


@dataclass(frozen=True)
class Access:
    """What guards the OpenAI endpoint, read at start: its keys and its TLS context."""

    keys: ApiKeys
    ssl: ssl.SSLContext | None
    metrics_need_key: bool

    @classmethod
    def of(cls, cfg: Config, env: Mapping[str, str] = os.environ) -> Access:
        """Raises ConfigError naming the key and file that cannot be used."""
        tls = server_context(cfg.ssl_certfile, cfg.ssl_keyfile)
        return cls(load_keys(cfg.api_key_file, env), tls, cfg.api_key_metrics)

    @property
    def scheme(self) -> str:
        return "http" if self.ssl is None else "https"

    def describe(self) -> str:
        """For `tokenrouterd --check`: how many keys and whence, never the keys."""
        if self.keys:
            where = ", ".join(self.keys.sources)
            keys = f"API keys: {len(self.keys)} set ({where}); /metrics " + (
                "needs a key" if self.metrics_need_key else "open"
            )
        else:
            keys = "API keys: none set (every route is open)"
        return f"{keys}; TLS " + ("on" if self.ssl else "off")

    def exposure(self, listen: Address) -> str | None:
        """The warning for an endpoint that anyone beyond this host may use, if it is one."""
        if self.keys or listen.is_loopback:
            return None
        return (f"listening on {listen}, beyond loopback, without an API key: anyone who "
                "reaches it may generate (set $TRD_API_KEY or api_key_file)")  # fmt: skip

    def guard(self, app: web.Application) -> None:
        refusals = RefusalLog()
        quiet_unparsable(refusals)
        if self.keys:
            protect(app, self.keys, self.metrics_need_key, refusals)
