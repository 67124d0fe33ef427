"""The handshake that opens a remote-engine link: versions, a shared token, the model card.

The daemon (client) connects to a remote engine (server). Nothing but this protocol is
accepted: a peer that does not complete it within HANDSHAKE_S, speaks another version or
does not know the token is refused and never reaches an engine. The token never crosses
the wire: each side proves it knows it with an HMAC over both HELLOs (their random
nonces, versions and the model name), so a recorded proof is useless for another
connection and a client proof cannot be replayed as a server proof.

    daemon (client)                                      remote engine (server)
      HELLO nonce_c, name  ------------------------->   magic? versions? its model?
                           <-------------------------   HELLO nonce_s, name   (or REFUSE)
      PROOF HMAC(token, "client" | transcript) ----->   checks it             (or REFUSE)
                           <-------------------------   PROOF HMAC(token, "server" | transcript)
                           <-------------------------   CARD: the model card, JSON
      checks the proof, then the card (trd/remote/card.py)

    transcript = the client's HELLO frame | the server's HELLO frame

Frames use trd/remote/tcp.py's length prefix; before the proofs a frame is at most
HELLO_LIMIT bytes. HELLO and REFUSE keep this layout in every version, so two peers of
different versions can still tell each other why they part:

    HELLO   tag 1 | magic "TRDL" | link version u16 | codec version u8 | nonce 32 B
            | n u8 | model name utf-8[n]
    PROOF   tag 2 | HMAC-SHA256 32 B
    CARD    tag 3 | JSON object utf-8
    REFUSE  tag 4 | reason utf-8

Authentication only: frames after the handshake are neither encrypted nor signed (they
carry token ids, never the token). Across an untrusted network, run the link inside a
VPN (WireGuard, IPsec).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import secrets
import struct
from dataclasses import dataclass
from typing import Any

from trd.protocol import VERSION as CODEC_VERSION
from trd.protocol import ProtocolError
from trd.remote.tcp import MAX_FRAME, read_frame, write_frame

LINK_VERSION = 1
MAGIC = b"TRDL"
HANDSHAKE_S = 5.0
HELLO_LIMIT = 1024
NONCE = 32
_HELLO = struct.Struct("<B4sHB32sB")
_T_HELLO, _T_PROOF, _T_CARD, _T_REFUSE = 1, 2, 3, 4


class HandshakeError(ProtocolError):
    """The peer broke the handshake, or speaks something else; the message says how.

    A peer that closes the connection midway raises ConnectionError instead (it may be
    restarting: worth another try)."""


class Refused(HandshakeError):
    """The peer refused us, and said why (or we refused it: the same words)."""


@dataclass(frozen=True, slots=True)
class Hello:
    nonce: bytes
    name: str
    link_version: int = LINK_VERSION
    codec_version: int = CODEC_VERSION
    magic: bytes = MAGIC

    def encode(self) -> bytes:
        name = self.name.encode()
        if len(name) > 255:
            raise HandshakeError(f"model name of {len(name)} bytes (limit 255)")
        head = _HELLO.pack(_T_HELLO, self.magic, self.link_version, self.codec_version,
                           self.nonce, len(name))  # fmt: skip
        return head + name

    @classmethod
    def decode(cls, frame: bytes) -> Hello:
        if frame[:1] == bytes([_T_REFUSE]):
            raise Refused(_text(frame[1:]))
        if len(frame) < _HELLO.size or frame[0] != _T_HELLO or frame[1:5] != MAGIC:
            raise HandshakeError(f"not a tokenrouterd link (first bytes {frame[:8]!r})")
        _, magic, link, codec, nonce, n = _HELLO.unpack_from(frame)
        if len(frame) != _HELLO.size + n:
            raise HandshakeError(f"HELLO of {len(frame)} bytes, its name says {_HELLO.size + n}")
        return cls(nonce, _text(frame[_HELLO.size :]), link, codec, magic)

    def version_problem(self) -> str | None:
        """Why we cannot talk to a peer that sent this HELLO, or None."""
        if (self.link_version, self.codec_version) == (LINK_VERSION, CODEC_VERSION):
            return None
        return (f"link protocol {self.link_version} with message codec {self.codec_version}, "
                f"this side speaks link {LINK_VERSION} with codec {CODEC_VERSION}")  # fmt: skip


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _mac(token: str, role: bytes, transcript: bytes) -> bytes:
    return hmac.new(token.encode(), role + b"|" + transcript, hashlib.sha256).digest()


async def _expect(reader: asyncio.StreamReader, tag: int, limit: int = HELLO_LIMIT) -> bytes:
    try:
        frame = await read_frame(reader, limit)
    except EOFError:
        raise ConnectionError("the peer closed the connection during the handshake") from None
    if frame[:1] == bytes([_T_REFUSE]):
        raise Refused(_text(frame[1:]))
    if frame[:1] != bytes([tag]):
        raise HandshakeError(f"expected handshake frame {tag}, got {frame[:1]!r}")
    return frame[1:]


async def refuse(writer: asyncio.StreamWriter, reason: str) -> Refused:
    """Tell the peer why we part (best effort) and return the error to raise."""
    # The peer may be gone already; the reason still goes to our log.
    with contextlib.suppress(OSError, ProtocolError):
        await write_frame(writer, bytes([_T_REFUSE]) + reason.encode())
    return Refused(reason)


async def serve(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    token: str,
    name: str,
    card: dict[str, Any],
) -> None:
    """The remote engine's side; raises HandshakeError (Refused when it refused the peer)."""
    try:
        hello_c = await read_frame(reader, HELLO_LIMIT)
    except ProtocolError as exc:  # e.g. an HTTP request: its first bytes read as a length
        raise HandshakeError(f"not a tokenrouterd link: {exc}") from None
    except EOFError:
        raise ConnectionError("the peer closed the connection before its HELLO") from None
    client = Hello.decode(hello_c)  # not our protocol: no answer at all
    problem = client.version_problem()
    if problem is None and client.name != name:
        problem = f"this engine serves model {name!r}, not {client.name!r}"
    if problem is not None:
        raise await refuse(writer, problem)
    hello_s = Hello(secrets.token_bytes(NONCE), name).encode()
    await write_frame(writer, hello_s)
    proof = await _expect(reader, _T_PROOF)
    if not hmac.compare_digest(proof, _mac(token, b"client", hello_c + hello_s)):
        raise await refuse(writer, "wrong token (remote_token differs)")
    await write_frame(writer, bytes([_T_PROOF]) + _mac(token, b"server", hello_c + hello_s))
    await write_frame(writer, bytes([_T_CARD]) + json.dumps(card).encode())


async def connect(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    token: str,
    name: str,
    hello: Hello | None = None,
) -> dict[str, Any]:
    """The daemon's side: the remote engine's model card once both sides proved the token.

    `hello` replaces our HELLO (tests speak other versions with it)."""
    hello_c = (hello or Hello(secrets.token_bytes(NONCE), name)).encode()
    await write_frame(writer, hello_c)
    try:
        hello_s = await read_frame(reader, HELLO_LIMIT)
    except EOFError:
        raise ConnectionError("the peer closed the connection before its HELLO") from None
    server = Hello.decode(hello_s)
    problem = server.version_problem()
    if problem is None and server.name != name:
        problem = f"the engine there serves model {server.name!r}, not {name!r}"
    if problem is not None:
        raise await refuse(writer, problem)
    await write_frame(writer, bytes([_T_PROOF]) + _mac(token, b"client", hello_c + hello_s))
    proof = await _expect(reader, _T_PROOF)
    if not hmac.compare_digest(proof, _mac(token, b"server", hello_c + hello_s)):
        raise HandshakeError("the remote engine's proof is wrong: it does not know the token")
    raw = await _expect(reader, _T_CARD, limit=MAX_FRAME)
    try:
        card = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HandshakeError(f"the model card is not JSON: {exc}") from None
    if not isinstance(card, dict):
        raise HandshakeError("the model card is not a JSON object")
    return card
