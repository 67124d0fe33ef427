"""Messages between the front end and the engines, and their binary codec (no pickle)."""

from trd.protocol.codec import MAX_MODELS, VERSION, decode, encode
from trd.protocol.messages import (
    MAX_EXTRA,
    Abort,
    Control,
    Done,
    Emit,
    FinishReason,
    Message,
    PeerKind,
    PeerReq,
    ProtocolError,
    Ready,
    SamplingParams,
    Stats,
    Submit,
)

__all__ = [
    "MAX_EXTRA",
    "MAX_MODELS",
    "VERSION",
    "Abort",
    "Control",
    "Done",
    "Emit",
    "FinishReason",
    "Message",
    "PeerKind",
    "PeerReq",
    "ProtocolError",
    "Ready",
    "SamplingParams",
    "Stats",
    "Submit",
    "decode",
    "encode",
]
