"""What one TCP frame of a remote-engine link carries once the handshake is over.

Rings need no addressing: a ring is one edge. A link multiplexes every edge that touches
the remote engine onto one stream, so each frame names its edge:

    | u32 length (trd/remote/tcp.py) | kind u8 | src u8 | dst u8 | body ... |

    kind 1 FRAME     body = one ring frame (a trd.protocol frame), from node src to dst
    kind 2 PING      body = f64, the sender's clock; the peer answers with a PONG
    kind 3 PONG      body = the PING's f64, echoed: the sender learns the round trip
    kind 4 COUNTERS  body = (slot u16 | value i64)*: the delayed-batching counters the
                     sender's host writes (trd/ipc/counters.py), for the peer to mirror

    node byte: 0..254 = engine index, 255 = the front end; src = dst = 255 when unused

Pure Python and torch-free; `EnvelopeError` for every malformed frame.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from trd.ipc.names import FRONTEND
from trd.protocol import ProtocolError

_HEAD = struct.Struct("<BBB")
_CLOCK = struct.Struct("<d")
_SLOT = struct.Struct("<Hq")
_FE_BYTE = 255
HEADER_SIZE = _HEAD.size


class EnvelopeError(ProtocolError):
    """A link frame that is not a well-formed envelope."""


class Kind(IntEnum):
    FRAME = 1
    PING = 2
    PONG = 3
    COUNTERS = 4


@dataclass(frozen=True, slots=True)
class Envelope:
    kind: Kind
    src: int = FRONTEND  # node ids as in trd/ipc/names.py: FRONTEND = -1, engines 0..254
    dst: int = FRONTEND
    body: bytes = b""


def _node_byte(node: int) -> int:
    if node == FRONTEND:
        return _FE_BYTE
    if not 0 <= node < _FE_BYTE:
        raise EnvelopeError(f"node {node} does not fit an envelope (engines 0..254)")
    return node


def _node(byte: int) -> int:
    return FRONTEND if byte == _FE_BYTE else byte


def header(kind: Kind, src: int, dst: int) -> bytes:
    """The envelope's first bytes; the body follows (written separately, not copied)."""
    return _HEAD.pack(kind, _node_byte(src), _node_byte(dst))


def encode(env: Envelope) -> bytes:
    return header(env.kind, env.src, env.dst) + env.body


def decode(frame: bytes) -> Envelope:
    if len(frame) < _HEAD.size:
        raise EnvelopeError(f"link frame of {len(frame)} bytes is shorter than its header")
    kind, src, dst = _HEAD.unpack_from(frame)
    if kind not in Kind._value2member_map_:
        raise EnvelopeError(f"unknown link frame kind {kind}")
    env = Envelope(Kind(kind), _node(src), _node(dst), frame[_HEAD.size :])
    if env.kind in (Kind.PING, Kind.PONG) and len(env.body) != _CLOCK.size:
        raise EnvelopeError(f"{env.kind.name} body of {len(env.body)} bytes, expected 8")
    if env.kind is Kind.COUNTERS and len(env.body) % _SLOT.size:
        raise EnvelopeError(f"COUNTERS body of {len(env.body)} bytes is not whole slots")
    if env.kind is Kind.FRAME and not env.body:
        raise EnvelopeError(f"empty FRAME from node {env.src} to node {env.dst}")
    return env


def ping(kind: Kind, clock: float) -> Envelope:
    """A PING carrying `clock`, or the PONG echoing it."""
    return Envelope(kind, body=_CLOCK.pack(clock))


def clock(env: Envelope) -> float:
    value: float = _CLOCK.unpack(env.body)[0]
    return value


def counters(slots: dict[int, int]) -> Envelope:
    return Envelope(Kind.COUNTERS, body=b"".join(_SLOT.pack(s, v) for s, v in slots.items()))


def slots(env: Envelope) -> dict[int, int]:
    view = memoryview(env.body)
    return {s: v for s, v in (_SLOT.unpack_from(view, i) for i in range(0, len(view), _SLOT.size))}
