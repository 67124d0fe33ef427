"""TLS for the OpenAI endpoint: the server's SSL context from `ssl_certfile`/`ssl_keyfile`.

Both files are PEM (the certificate file may hold the chain after the leaf); the key
must not be encrypted, since nobody is there to type a passphrase. Each file is read
at start, before any engine loads: a missing or unreadable one, or a key that is not
the certificate's, stops the daemon with a config error naming the key and the file.
The admin API stays plain HTTP: it listens only on loopback or a unix socket.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from trd.config_reader import ConfigError, fail


def server_context(certfile: Path | None, keyfile: Path | None) -> ssl.SSLContext | None:
    """None without TLS; a context that serves `certfile` with `keyfile`'s key."""
    if certfile is None and keyfile is None:
        return None
    if certfile is None or keyfile is None:
        given = "ssl_certfile" if keyfile is None else "ssl_keyfile"
        raise ConfigError(f"{given}: TLS needs both ssl_certfile and ssl_keyfile")
    for key, path in (("ssl_certfile", certfile), ("ssl_keyfile", keyfile)):
        try:
            with path.open("rb") as f:
                f.read(1)
        except OSError as exc:
            fail(key, str(path), f"cannot read it: {exc.strerror}")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        # An empty password: an encrypted key fails here instead of prompting on a tty.
        ctx.load_cert_chain(certfile, keyfile, password="")
    except ssl.SSLError as exc:
        fail("ssl_certfile", str(certfile), f"with ssl_keyfile {str(keyfile)!r}: not a PEM "
             f"certificate and its unencrypted private key ({exc.reason or exc})")  # fmt: skip
    return ctx
