"""Codec frames over a real loopback TCP connection."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from trd.protocol import (
    Abort,
    Emit,
    FinishReason,
    Message,
    PeerKind,
    PeerReq,
    ProtocolError,
    SamplingParams,
    decode,
    encode,
)
from trd.remote.tcp import MAX_FRAME, read_frame, write_frame

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Client = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[object]]

MESSAGES: list[Message] = [
    PeerReq(
        rid=1,
        handoff_seq=1,
        kind=PeerKind.HANDOFF,
        loc=5,
        tokens=np.arange(5, dtype=np.int32),
        prompt_len=5,
        params=SamplingParams(seed=1),
        extra=b"\x01",
        sent_at=2.0,
        anchors=np.array([5, 0], dtype=np.uint32),
    ),
    Emit(1, 0, np.arange(100_000, dtype=np.int32), np.ones(100_000, np.uint8), FinishReason.STOP),
    Abort(1),
]


async def with_server(
    handler: Handler,
    client: Client,
) -> object:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await asyncio.wait_for(client(reader, writer), 10)
    finally:
        writer.close()
        server.close()
        await server.wait_closed()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            await write_frame(writer, encode(decode(await read_frame(reader))))
    except EOFError:
        writer.close()


def test_messages_round_trip_over_loopback() -> None:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> list[bytes]:
        for msg in MESSAGES:
            await write_frame(writer, encode(msg))
        return [await read_frame(reader) for _ in MESSAGES]

    echoed = asyncio.run(with_server(echo, client))
    assert echoed == [encode(msg) for msg in MESSAGES]


def sender(raw: bytes, close: bool) -> Handler:
    async def send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(raw)
        await writer.drain()
        if close:
            writer.close()

    return send


@pytest.mark.parametrize(
    ("raw", "close", "error", "match"),
    [
        (b"", True, EOFError, "peer closed"),
        (b"\x05\x00", True, ProtocolError, "inside a frame length"),
        (struct.pack("<I", 10) + b"abc", True, ProtocolError, "after 3 of 10 frame bytes"),
        (struct.pack("<I", MAX_FRAME + 1), False, ProtocolError, "exceeds 67108864"),
    ],
)
def test_bad_streams_raise(raw: bytes, close: bool, error: type[Exception], match: str) -> None:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_frame(reader)

    with pytest.raises(error, match=match):
        asyncio.run(with_server(sender(raw, close), client))


def test_write_frame_refuses_oversize() -> None:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await write_frame(writer, bytes(MAX_FRAME + 1))

    with pytest.raises(ProtocolError, match="exceeds 67108864"):
        asyncio.run(with_server(echo, client))
