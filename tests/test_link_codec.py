"""The remote-engine link's envelope and handshake, pure Python over loopback TCP."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from trd.ipc.names import FRONTEND
from trd.protocol import (
    VERSION,
    Abort,
    PeerKind,
    PeerReq,
    SamplingParams,
    decode,
    encode,
    restamp,
)
from trd.remote import envelope
from trd.remote.envelope import Envelope, EnvelopeError, Kind
from trd.remote.handshake import (
    HELLO_LIMIT,
    LINK_VERSION,
    HandshakeError,
    Hello,
    Refused,
    connect,
    serve,
)
from trd.remote.tcp import read_frame, write_frame

TOKEN = "shared-secret-0123456789"
CARD = {"name": "large", "index": 1, "pid": 42}
Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


# -- envelope ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "env",
    [
        Envelope(Kind.FRAME, FRONTEND, 0, b"\x04\x02abc"),
        Envelope(Kind.FRAME, 254, FRONTEND, bytes(range(256))),
        envelope.ping(Kind.PING, 12.5),
        envelope.ping(Kind.PONG, -3.25),
        envelope.counters({0: 3, 1: -1, 511: 2**62}),
    ],
)
def test_envelopes_round_trip(env: Envelope) -> None:
    assert envelope.decode(envelope.encode(env)) == env


def test_envelope_layout_is_kind_src_dst_then_body() -> None:
    raw = envelope.encode(Envelope(Kind.FRAME, FRONTEND, 7, b"xyz"))
    assert raw == bytes([1, 255, 7]) + b"xyz"
    assert envelope.clock(envelope.decode(envelope.encode(envelope.ping(Kind.PING, 1.5)))) == 1.5
    slots = {3: 9, 700: -5}
    assert envelope.slots(envelope.decode(envelope.encode(envelope.counters(slots)))) == slots


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\x01\xff", "shorter than its header"),
        (b"\x09\xff\x00x", "unknown link frame kind 9"),
        (b"\x02\xff\xff" + b"1234567", "PING body of 7 bytes"),
        (b"\x03\xff\xff" + b"123456789", "PONG body of 9 bytes"),
        (b"\x04\xff\xff" + b"\x00" * 11, "not whole slots"),
        (b"\x01\x00\x01", "empty FRAME"),
    ],
)
def test_malformed_envelopes_raise(raw: bytes, match: str) -> None:
    with pytest.raises(EnvelopeError, match=match):
        envelope.decode(raw)


@pytest.mark.parametrize("node", [255, 300, -2])
def test_nodes_outside_a_byte_are_refused(node: int) -> None:
    with pytest.raises(EnvelopeError, match=f"node {node}"):
        envelope.header(Kind.FRAME, node, 0)


def test_restamp_moves_only_a_peer_requests_sent_at() -> None:
    msg = PeerReq(
        7, 3, PeerKind.HANDOFF, 4, np.arange(6, dtype=np.int32), 4, SamplingParams(seed=1),
        b"\x01", 100.0, np.array([10, 4], dtype=np.uint32),
    )  # fmt: skip
    moved = decode(restamp(encode(msg), -99.5))
    assert isinstance(moved, PeerReq) and moved.sent_at == 0.5
    moved.sent_at = msg.sent_at
    assert encode(moved) == encode(msg)
    other = encode(Abort(7))
    assert restamp(other, 5.0) == other


# -- handshake -----------------------------------------------------------------------------
async def pair(
    server: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[Any]],
    client: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[Any]],
) -> tuple[Any, Any]:
    """Run `server` on one accepted connection and `client` on its other end; results or
    the exceptions they raised, plus every byte that crossed (for the wire checks)."""
    results: dict[str, Any] = {}
    done = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            results["server"] = await server(reader, writer)
        except Exception as exc:
            results["server"] = exc
        finally:
            writer.close()
            done.set()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        results["client"] = await asyncio.wait_for(client(reader, writer), 10)
    except Exception as exc:
        results["client"] = exc
    writer.close()
    await asyncio.wait_for(done.wait(), 10)
    srv.close()
    return results["server"], results["client"]


def handshake(
    client_token: str = TOKEN, hello: Hello | None = None, name: str = "large"
) -> tuple[Any, Any]:
    return asyncio.run(
        pair(
            lambda r, w: serve(r, w, TOKEN, "large", CARD),
            lambda r, w: connect(r, w, client_token, name, hello),
        )
    )


def test_both_sides_prove_the_token_and_the_client_gets_the_card() -> None:
    server, client = handshake()
    assert server is None
    assert client == CARD


def test_a_wrong_token_is_refused_on_both_sides_with_the_reason() -> None:
    server, client = handshake(client_token="another-secret-0123456")
    assert isinstance(server, Refused) and "wrong token" in str(server)
    assert isinstance(client, Refused) and "wrong token" in str(client)


@pytest.mark.parametrize(
    ("hello", "match"),
    [
        (Hello(b"n" * 32, "large", link_version=LINK_VERSION + 1), "link protocol 2"),
        (Hello(b"n" * 32, "large", codec_version=VERSION + 1), f"message codec {VERSION + 1}"),
    ],
)
def test_another_version_is_refused_before_any_proof(hello: Hello, match: str) -> None:
    server, client = handshake(hello=hello)
    assert isinstance(server, Refused) and match in str(server)
    assert isinstance(client, Refused) and match in str(client)


def test_a_daemon_asking_for_another_model_is_refused() -> None:
    server, client = handshake(name="mid")
    assert isinstance(server, Refused) and "serves model 'large', not 'mid'" in str(server)
    assert isinstance(client, Refused) and "not 'mid'" in str(client)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "not a tokenrouterd link"),
        (struct.pack("<I", 5) + b"\x01TRDX", "not a tokenrouterd link"),
        (struct.pack("<I", HELLO_LIMIT + 1), "not a tokenrouterd link"),
    ],
)
def test_other_protocols_get_no_answer(raw: bytes, match: str) -> None:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        writer.write(raw)
        await writer.drain()
        return await reader.read()  # the server closes without a word

    server, answer = asyncio.run(pair(lambda r, w: serve(r, w, TOKEN, "large", CARD), client))
    assert isinstance(server, HandshakeError) and match in str(server)
    assert answer == b""


def test_the_token_never_crosses_and_a_replayed_proof_fails() -> None:
    """Record a good session's bytes; the token is not in them, and its client proof
    does not open a second session (the server's nonce differs)."""
    wire: list[bytes] = []

    async def recording_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Any:
        hello = Hello(b"c" * 32, "large").encode()
        await write_frame(writer, hello)
        server_hello = await read_frame(reader)
        proof = hmac.new(TOKEN.encode(), b"client|" + hello + server_hello, hashlib.sha256)
        await write_frame(writer, b"\x02" + proof.digest())
        wire.extend([hello, server_hello, proof.digest(), await read_frame(reader)])
        return proof.digest()

    _, proof = asyncio.run(pair(lambda r, w: serve(r, w, TOKEN, "large", CARD), recording_client))
    assert isinstance(proof, bytes)
    assert all(TOKEN.encode() not in frame for frame in wire)

    async def replaying_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Any:
        await write_frame(writer, Hello(b"c" * 32, "large").encode())
        await read_frame(reader)
        await write_frame(writer, b"\x02" + proof)
        return await read_frame(reader)

    server, answer = asyncio.run(
        pair(lambda r, w: serve(r, w, TOKEN, "large", CARD), replaying_client)
    )
    assert isinstance(server, Refused) and "wrong token" in str(server)
    assert answer.startswith(b"\x04") and b"wrong token" in answer


def test_an_impostor_server_is_caught_by_its_proof() -> None:
    """A server that accepts any client proof but does not know the token."""

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_frame(reader)
        await write_frame(writer, Hello(b"s" * 32, "large").encode())
        await read_frame(reader)
        await write_frame(writer, b"\x02" + bytes(32))
        await write_frame(writer, b'\x03{"name": "large"}')

    _, client = asyncio.run(pair(impostor, lambda r, w: connect(r, w, TOKEN, "large")))
    assert isinstance(client, HandshakeError) and "does not know the token" in str(client)


def test_a_peer_that_hangs_up_midway_is_a_connection_error() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_frame(reader)

    _, client = asyncio.run(pair(hang_up, lambda r, w: connect(r, w, TOKEN, "large")))
    assert isinstance(client, ConnectionError)
