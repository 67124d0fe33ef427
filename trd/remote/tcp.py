"""The ring's frames over a TCP stream, for a peer engine on another host.

Each frame is a u32 little-endian length followed by the payload, as in a ring.
"""

from __future__ import annotations

import asyncio
import struct

from trd.protocol import ProtocolError

MAX_FRAME = 64 << 20
_LEN = struct.Struct("<I")


async def write_frame(writer: asyncio.StreamWriter, frame: bytes) -> None:
    """Send one frame and wait until the transport's buffer drains below its limit."""
    if len(frame) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME}")
    writer.write(_LEN.pack(len(frame)) + frame)
    await writer.drain()


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME) -> bytes:
    """Receive one frame; EOFError on a clean close between frames.

    A length over `limit` or a close inside a frame raises ProtocolError (a peer that
    has not authenticated yet gets a small `limit`: it cannot make us allocate 64 MiB).
    """
    try:
        prefix = await reader.readexactly(_LEN.size)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            raise EOFError("peer closed the stream") from e
        raise ProtocolError("stream closed inside a frame length") from e
    (n,) = _LEN.unpack(prefix)
    if n > limit:
        raise ProtocolError(f"frame length {n} exceeds {limit}")
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as e:
        raise ProtocolError(f"stream closed after {len(e.partial)} of {n} frame bytes") from e
