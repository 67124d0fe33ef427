"""Message codec: exact round trips, and ProtocolError for every malformed frame."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trd.protocol import (
    MAX_EXTRA,
    MAX_MODELS,
    VERSION,
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
    RoutingParams,
    SamplingParams,
    Stats,
    Submit,
    decode,
    encode,
    int_range,
)

PARAMS = SamplingParams(
    max_tokens=300,
    temperature=0.7,
    top_p=0.9,
    top_k=40,
    seed=2**63 - 1,
    stop_token_ids=(0, 151645, 2**31 - 1),
    ignore_eos=True,
    min_tokens=7,
    grammar='{"grammars": [{"lark_grammar": "start: \\"é\\""}]}',
    priority=-(2**31),
)
# Each of the three per-request routings, and the largest priority
ROUTED = [
    SamplingParams(routing=RoutingParams(large_share=0.25), priority=2**31 - 1),
    SamplingParams(routing=RoutingParams(threshold=0.0)),
    SamplingParams(routing=RoutingParams(model=MAX_MODELS - 1), priority=3),
]


def i32(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def u32(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.uint32)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def assert_same(a: Message, b: Message) -> None:
    assert type(a) is type(b)
    for field in a.__dataclass_fields__:
        x: Any = getattr(a, field)
        y: Any = getattr(b, field)
        if isinstance(x, np.ndarray):
            assert y.dtype == x.dtype and y.shape == x.shape, field
            assert x.tobytes() == y.tobytes(), field  # bit-exact, NaN payloads included
        elif isinstance(x, float) and math.isnan(x):
            assert isinstance(y, float) and math.isnan(y), field
        else:
            assert type(x) is type(y) and x == y, field


LONG = np.arange(70_000, dtype=np.int32)
ANCHORS = np.arange(MAX_MODELS, dtype=np.uint32) * 16_843_009  # up to 0xFEFEFEFE
SAMPLES: list[Message] = [
    Submit(rid=1, prompt=i32(5), params=SamplingParams()),
    Submit(rid=2**64 - 1, prompt=i32(*range(1000)), params=PARAMS),
    PeerReq(7, 1, PeerKind.HANDOFF, 12, i32(1, 2, 3), 10, PARAMS, b"", 3.25, u32(12, 0)),
    PeerReq(7, 2**32 - 1, PeerKind.FINISH, 15, i32(), 10, None, b"\x00\xff", 4.0, u32()),
    PeerReq(8, 5, PeerKind.ABORT, 0, LONG, 1, None, bytes(MAX_EXTRA), 0.0, ANCHORS),
    Emit(9, 0, i32(11, 12), np.array([0, 1], np.uint8), FinishReason.NONE),
    Emit(9, 2, i32(), np.array([], np.uint8), FinishReason.ERROR, "engine 1 died: ü"),
    Emit(10, 2**32 - 1, i32(2**31 - 1), np.array([255], np.uint8), FinishReason.LENGTH),
    Abort(rid=0),
    Abort(rid=2**64 - 1),
    Ready(model=1, pid=4242, kv_pages=2**32 - 1, page_size=16),
    Ready(2, 77, 0, 16, error="checkpoint broken: größe ≠ 7 🚫"),
    Done(
        rid=3, model=1, fed_tokens=40, forwards=9, holders=0b101, handoff_latencies=f32(1e-4, 2.5)
    ),
    Done(2**64 - 1, 255, 2**32 - 1, 0, 2**64 - 1, f32()),
    Done(4, 0, 0, 0, 1, f32(float("nan"), float("inf"), -0.0, 3.4028235e38)),
    PeerReq(9, 3, PeerKind.HANDOFF, 7, i32(5, 6), 4, None, b"pol", 1.5, u32(7, 2**32 - 1, 0)),
    *(Submit(13, i32(1), p) for p in ROUTED),
    PeerReq(14, 2, PeerKind.HANDOFF, 0, i32(1), 1, ROUTED[0], b"", 0.5, u32(1, 0), 2**32 - 1, 0.5),
    PeerReq(14, 3, PeerKind.HANDOFF, 9, i32(2), 1, None, b"", 0.5, u32(9, 8), 3, float("inf")),
    Emit(
        11,
        3,
        i32(4, 5),
        np.array([0, 1], np.uint8),
        FinishReason.STOP,
        "",
        f32(-0.5, float("-inf")),
        i32(4, 9, 5, 4),
        f32(-0.5, -1.25, -0.0, -2.0),
    ),
    Emit(12, 0, i32(7), np.array([1], np.uint8), FinishReason.NONE, "", f32(-3.0), i32(), f32()),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip_is_exact(msg: Message) -> None:
    frame = encode(msg)
    assert_same(decode(frame), msg)
    assert_same(decode(memoryview(frame)), msg)
    assert_same(decode(bytearray(frame)), msg)


def test_decoded_arrays_are_writable_copies() -> None:
    frame = bytearray(encode(SAMPLES[2]))
    msg = decode(frame)
    assert isinstance(msg, PeerReq)
    frame[:] = bytes(len(frame))  # a ring reuses its buffer after get()
    assert msg.tokens.tolist() == [1, 2, 3]
    msg.tokens[0] = 99
    assert msg.tokens.flags.owndata
    assert msg.anchors.tolist() == [12, 0] and msg.anchors.flags.writeable
    done = decode(frame := bytearray(encode(SAMPLES[12])))
    assert isinstance(done, Done)
    frame[:] = bytes(len(frame))
    assert done.handoff_latencies.tolist() == [np.float32(1e-4), 2.5]
    assert done.handoff_latencies.flags.owndata and done.handoff_latencies.flags.writeable


def test_peer_frame_layout_is_stable() -> None:
    msg = PeerReq(1, 2, PeerKind.HANDOFF, 3, i32(4), 5, None, b"x", 0.0, u32(9, 2**32 - 1))
    head = struct.pack("<BBQIBIIdIIBBId", 2, VERSION, 1, 2, 1, 3, 5, 0.0, 1, 1, 0, 2, 0, math.nan)
    assert encode(msg) == head + struct.pack("<iII", 4, 9, 2**32 - 1) + b"x"
    routed = dataclasses.replace(msg, large=7, tau=0.5)
    head = head[:-12] + struct.pack("<Id", 7, 0.5)
    assert encode(routed) == head + struct.pack("<iII", 4, 9, 2**32 - 1) + b"x"


def test_submit_frame_layout_is_stable() -> None:
    p = SamplingParams(5, 0.5, 0.25, 3, None, (7,), ignore_eos=True, min_tokens=2)
    head = struct.pack("<BBQI", 1, VERSION, 9, 1)
    nan = math.nan
    fixed = (5, 0.5, 0.25, 3, -1, 1, 2, -1, 0, nan, nan, 255, 1, 0)
    params = struct.pack("<IddIqBIbiddBII", *fixed) + struct.pack("<i", 7)
    assert encode(Submit(9, i32(4), p)) == head + params + struct.pack("<i", 4)
    with_logprobs = dataclasses.replace(p, logprobs=20, grammar="start: /é/")
    params = params[:-34] + struct.pack("<biddBIIi", 20, 0, nan, nan, 255, 1, 11, 7)
    params += "start: /é/".encode()
    assert encode(Submit(9, i32(4), with_logprobs)) == head + params + struct.pack("<i", 4)
    routed = dataclasses.replace(p, priority=-2, routing=RoutingParams(model=1))
    params = struct.pack("<IddIqBIbiddBII", *fixed[:8], -2, nan, nan, 1, 1, 0)
    assert encode(Submit(9, i32(4), routed)) == head + params + struct.pack("<ii", 7, 4)
    shared = dataclasses.replace(p, routing=RoutingParams(large_share=0.25))
    params = struct.pack("<IddIqBIbiddBII", *fixed[:9], 0.25, nan, 255, 1, 0)
    assert encode(Submit(9, i32(4), shared)) == head + params + struct.pack("<ii", 7, 4)


def test_int_range_is_what_a_format_code_carries() -> None:
    assert [int_range(code) for code in "BIiq"] == [
        (0, 255), (0, 2**32 - 1), (-(2**31), 2**31 - 1), (-(2**63), 2**63 - 1)
    ]  # fmt: skip
    for code in "BIiq":
        lo, hi = int_range(code)
        struct.pack(code, lo), struct.pack(code, hi)
        for outside in (lo - 1, hi + 1):
            with pytest.raises(struct.error):
                struct.pack(code, outside)


def test_ready_and_done_frame_layouts_are_stable() -> None:
    ready = Ready(1, 2, 3, 4, "é")
    assert encode(ready) == struct.pack("<BBBIIII", 5, VERSION, 1, 2, 3, 4, 2) + "é".encode()
    assert encode(Ready(1, 2, 3, 4)) == struct.pack("<BBBIIII", 5, VERSION, 1, 2, 3, 4, 0)
    done = Done(1, 2, 3, 4, 2**63 | 1, f32(0.5, -1.0))
    head = struct.pack("<BBQBIIQI", 6, VERSION, 1, 2, 3, 4, 2**63 | 1, 2)
    assert encode(done) == head + struct.pack("<ff", 0.5, -1.0)


ints = st.integers
tokens = st.lists(ints(-(2**31), 2**31 - 1), max_size=50).map(lambda v: np.array(v, np.int32))
params = st.builds(
    SamplingParams,
    max_tokens=ints(1, 2**32 - 1),
    temperature=st.floats(0, 10),
    top_p=st.floats(1e-6, 1),
    top_k=ints(0, 2**32 - 1),
    seed=st.none() | ints(0, 2**63 - 1),
    stop_token_ids=st.lists(ints(0, 2**31 - 1), max_size=4).map(tuple),
    ignore_eos=st.booleans(),
    min_tokens=ints(0, 1),
    routing=st.one_of(
        st.builds(RoutingParams),
        st.builds(RoutingParams, large_share=st.floats(0, 1, exclude_min=True, exclude_max=True)),
        st.builds(RoutingParams, threshold=st.floats(0, 1e300)),
        st.builds(RoutingParams, model=ints(0, MAX_MODELS - 1)),
    ),
    priority=ints(-(2**31), 2**31 - 1),
)
peer_reqs = st.builds(
    PeerReq,
    rid=ints(0, 2**64 - 1),
    handoff_seq=ints(0, 2**32 - 1),
    kind=st.sampled_from(PeerKind),
    loc=ints(0, 2**32 - 1),
    tokens=tokens,
    prompt_len=ints(0, 2**32 - 1),
    params=st.none() | params,
    extra=st.binary(max_size=64),
    sent_at=st.floats(allow_nan=False),
    anchors=st.lists(ints(0, 2**32 - 1), max_size=MAX_MODELS).map(lambda v: np.array(v, np.uint32)),
    large=ints(0, 2**32 - 1),
    tau=st.floats(),
)
dones = st.builds(
    Done,
    rid=ints(0, 2**64 - 1),
    model=ints(0, 255),
    fed_tokens=ints(0, 2**32 - 1),
    forwards=ints(0, 2**32 - 1),
    holders=ints(0, 2**64 - 1),
    handoff_latencies=st.lists(st.floats(width=32), max_size=20).map(lambda v: f32(*v)),
)
readies = st.builds(
    Ready,
    model=ints(0, 255),
    pid=ints(0, 2**32 - 1),
    kv_pages=ints(0, 2**32 - 1),
    page_size=ints(0, 2**32 - 1),
    error=st.text(max_size=40),
)
emits = st.lists(st.tuples(ints(-(2**31), 2**31 - 1), ints(0, 255)), max_size=50).flatmap(
    lambda pairs: st.builds(
        Emit,
        rid=ints(0, 2**64 - 1),
        pos=ints(0, 2**32 - 1),
        tokens=st.just(np.array([t for t, _ in pairs], np.int32)),
        models=st.just(np.array([m for _, m in pairs], np.uint8)),
        finish=st.sampled_from(FinishReason),
        error=st.text(max_size=20),
    )
)


@settings(max_examples=250, deadline=None)
@given(peer_reqs | emits | dones | readies)
def test_round_trip_property(msg: Message) -> None:
    assert_same(decode(encode(msg)), msg)


@pytest.mark.parametrize("msg", SAMPLES[:4] + SAMPLES[5:], ids=lambda m: type(m).__name__)
def test_every_truncation_is_rejected(msg: Message) -> None:
    frame = encode(msg)
    for cut in range(len(frame)):
        with pytest.raises(ProtocolError):
            decode(frame[:cut])


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_trailing_bytes_are_rejected(msg: Message) -> None:
    with pytest.raises(ProtocolError, match="1 trailing bytes"):
        decode(encode(msg) + b"\x00")


def patched(msg: Message, offset: int, fmt: str, value: float) -> bytes:
    frame = bytearray(encode(msg))
    struct.pack_into(fmt, frame, offset, value)
    return bytes(frame)


def at(prefix: str) -> int:
    """Offset of the field that follows the struct `prefix` (the codec's layout, drawn there)."""
    return struct.calcsize("<" + prefix)


# Submit: tag ver rid n_prompt | params: max_tokens temperature top_p top_k seed ignore_eos
# min_tokens logprobs n_stop n_grammar | stop ids | grammar.  PeerReq: tag ver rid seq kind
# loc prompt_len sent_at n_tok n_extra has_params n_anchors.  Emit: tag ver rid pos finish n n_error
# has_logprobs k.
SUBMIT, PARAMS_AT = "BBQ", "BBQI"
ROUTED_SUBMIT = Submit(13, i32(1), ROUTED[0])
PEER = "BBQIBIIdI"


@pytest.mark.parametrize(
    ("frame", "match"),
    [
        (b"", "truncated frame: 0 bytes"),
        (bytes([9, VERSION]) + bytes(30), "unknown message tag 9"),
        (bytes([0, VERSION]) + bytes(30), "unknown message tag 0"),
        (patched(Abort(1), 1, "<B", 9), "unsupported protocol version 9"),
        (patched(SAMPLES[2], at("BBQI"), "<B", 0), "bad PeerKind 0"),
        (patched(SAMPLES[5], at("BBQI"), "<B", 5), "bad FinishReason 5"),
        (patched(SAMPLES[3], at(PEER + "I"), "<B", 2), "bad has_params byte 2"),
        (patched(SAMPLES[3], at(PEER), "<I", MAX_EXTRA + 1), "extra is 65537 bytes"),
        (patched(SAMPLES[0], at(SUBMIT), "<I", 0), "Submit.prompt is empty"),
        (patched(SAMPLES[0], at(PARAMS_AT), "<I", 0), "max_tokens must be >= 1, got 0"),
        (patched(SAMPLES[0], at(PARAMS_AT + "I"), "<d", -1.0), "temperature must be >= 0"),
        (patched(SAMPLES[0], at(PARAMS_AT + "Id"), "<d", float("nan")), "top_p must be in"),
        (patched(SAMPLES[0], at(PARAMS_AT + "IddI"), "<q", -2), "seed must be None or in"),
        (patched(SAMPLES[0], at(PARAMS_AT + "IddIq"), "<B", 3), "bad ignore_eos byte 3"),
        (patched(SAMPLES[0], at(PARAMS_AT + "IddIqB"), "<I", 17), "min_tokens must be in"),
        (patched(SAMPLES[0], at(PARAMS_AT + "IddIqBI"), "<b", 21), "logprobs must be None or in"),
        (patched(SAMPLES[1], at(PARAMS_AT + "IddIqBIbiddBII"), "<i", -5), "stop_token_ids must"),
        (patched(SAMPLES[0], at(PARAMS_AT + "IddIqBIbiddBI"), "<I", 99), "grammar needs"),
        (patched(SAMPLES[0], at(PARAMS_AT + "IddIqBIbi"), "<d", 1.0), "large_share must be in"),
        (patched(SAMPLES[0], at(PARAMS_AT + "IddIqBIbid"), "<d", -0.5), "threshold must be a"),
        (patched(ROUTED_SUBMIT, at(PARAMS_AT + "IddIqBIbid"), "<d", 0.5), "one of large_share"),
        (patched(SAMPLES[-2], at("BBQIBII"), "<B", 2), "bad has_logprobs byte 2"),
        (patched(SAMPLES[-2], at("BBQIBIIB"), "<B", 3), "truncated frame"),
        (patched(SAMPLES[5], 19, "<I", 1) + b"\xff", "Emit.error is not utf-8"),
        (patched(SAMPLES[5], 15, "<I", 3), "truncated frame: array needs"),
        (patched(SAMPLES[10], 15, "<I", 1) + b"\xff", "Ready.error is not utf-8"),
        (patched(SAMPLES[11], 15, "<I", 99), "truncated frame: Ready.error needs 118 bytes"),
        (encode(SAMPLES[10])[:15], "truncated frame: 15 bytes, header needs 19"),
        (patched(SAMPLES[13], 27, "<I", 2**32 - 1), "truncated frame: array needs"),
        (patched(SAMPLES[12], 27, "<I", 1), "4 trailing bytes after Done"),
        (patched(SAMPLES[15], at(PEER + "IB"), "<B", 4), "truncated frame: array needs"),
        (patched(SAMPLES[15], at(PEER + "IB"), "<B", 2), "4 trailing bytes after PeerReq"),
        (patched(SAMPLES[3], at(PEER + "IB"), "<B", 255), "truncated frame: array needs"),
    ],
)
def test_malformed_frames_name_the_problem(frame: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode(frame)


def test_decode_rejects_non_bytes() -> None:
    with pytest.raises(ProtocolError, match="bytes-like"):
        decode("abc")  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8]), st.binary(max_size=120))
def test_garbage_never_raises_anything_but_protocol_error(tag: int, body: bytes) -> None:
    for frame in (bytes([tag, VERSION]) + body, body):
        with contextlib.suppress(ProtocolError):
            decode(frame)


def peer(**kw: Any) -> PeerReq:
    base = PeerReq(1, 1, PeerKind.HANDOFF, 0, i32(), 0, None, b"", 0.0, u32(0, 0))
    return dataclasses.replace(base, **kw)


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        (Submit(1, i32(), SamplingParams()), "prompt must not be empty"),
        (Submit(1, np.array([1], np.int64), SamplingParams()), "Submit.prompt must be"),
        (peer(tokens=[1]), "PeerReq.tokens must be a 1-D int32 numpy array"),
        (peer(extra=bytes(MAX_EXTRA + 1)), "extra is 65537 bytes"),
        (peer(handoff_seq=2**32), "cannot encode PeerReq"),
        (peer(anchors=[0, 1]), "PeerReq.anchors must be a 1-D uint32 numpy array"),
        (peer(anchors=np.array([0, 1], np.int32)), "anchors must be a 1-D uint32"),
        (peer(anchors=np.array([0, 1], np.uint64)), "anchors must be a 1-D uint32"),
        (peer(anchors=np.zeros((1, 2), np.uint32)), "anchors must be a 1-D uint32"),
        (peer(anchors=np.zeros(MAX_MODELS + 1, np.uint32)), "anchors has 256 entries, limit 255"),
        (Emit(1, 0, i32(1, 2), np.array([0], np.uint8), FinishReason.NONE), "models \\(1,\\)"),
        (Emit(1, 0, i32(1), np.array([0], np.int32), FinishReason.NONE), "uint8"),
        (
            Emit(1, 0, i32(1), np.array([0], np.uint8), FinishReason.NONE, "", f32(-1.0)),
            "needs Emit.top_ids",
        ),
        (
            Emit(
                1,
                0,
                i32(1),
                np.array([0], np.uint8),
                FinishReason.NONE,
                "",
                f32(-1.0, -2.0),
                i32(),
                f32(),
            ),
            "do not fit 1 tokens",
        ),
        (
            Emit(
                1,
                0,
                i32(1, 2),
                np.array([0, 0], np.uint8),
                FinishReason.NONE,
                "",
                f32(-1.0, -2.0),
                i32(3),
                f32(-1.0),
            ),
            "do not fit 2 tokens",
        ),
        (Abort(-1), "cannot encode Abort"),
        (Ready(1, 2, 3, 4, "\ud800"), "cannot encode Ready"),
        (Ready(256, 2, 3, 4, "x"), "cannot encode Ready"),
        (Done(1, 0, 0, 0, 0, np.array([0.5])), "handoff_latencies must be a 1-D float32"),
        (Done(1, 0, 0, 0, 0, [0.5]), "handoff_latencies must be a 1-D float32"),  # type: ignore[arg-type]
        (Done(1, 0, 0, 0, 0, np.zeros((2, 1), np.float32)), "must be a 1-D float32"),
        (Done(1, 0, 0, 0, 0, np.array([1], np.float16)), "must be a 1-D float32"),
        (Done(1, 0, 0, 0, 2**64, f32()), "cannot encode Done"),
        (Done(1, 0, -1, 0, 0, f32()), "cannot encode Done"),
        ("not a message", "cannot encode str"),
    ],
)
def test_encode_rejects_what_the_wire_cannot_carry(msg: Any, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        encode(msg)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ({"temperature": -0.5}, "temperature must be >= 0, got -0.5"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"top_k": -1}, "top_k must be >= 0, got -1"),
        ({"logprobs": 21}, r"logprobs must be None or in \[0, 20\], got 21"),
        ({"logprobs": -1}, "logprobs must be None or in"),
        ({"seed": -1}, r"seed must be None or in \[0, 2\*\*63\), got -1"),
        ({"seed": 2**63}, "got 9223372036854775808"),
        ({"stop_token_ids": (3, -1)}, r"stop_token_ids must be in .*got \(3, -1\)"),
        ({"min_tokens": 17}, r"min_tokens must be in \[0, max_tokens\], got 17"),
        ({"min_tokens": -1}, r"min_tokens must be in \[0, max_tokens\], got -1"),
        ({"priority": 2**31}, r"priority must be in \[-2\*\*31, 2\*\*31\), got 2147483648"),
        ({"priority": -(2**31) - 1}, "priority must be in"),
    ],
)
def test_sampling_params_validation(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "msg",
    [Stats(3, '{"running": 2, "name": "große"}'), Stats(0, ""), Control('{"op": "set"}')],
)
def test_json_messages_round_trip_and_reject_truncation(msg: Message) -> None:
    frame = encode(msg)
    assert decode(frame) == msg
    for cut in range(len(frame)):
        with pytest.raises(ProtocolError):
            decode(frame[:cut])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"large_share": 0.0}, r"routing.large_share must be in \(0, 1\), got 0.0"),
        ({"large_share": 1.0}, "large_share must be in"),
        ({"large_share": float("nan")}, "large_share must be in"),
        ({"threshold": -0.1}, "routing.threshold must be a finite number >= 0, got -0.1"),
        ({"threshold": float("inf")}, "threshold must be a finite number"),
        ({"model": MAX_MODELS}, "routing.model must be a model index below 255, got 255"),
        ({"model": -1}, "model must be a model index"),
        ({"large_share": 0.2, "model": 1}, r"one of .*got \['large_share', 'model'\]"),
        ({"threshold": 0.2, "large_share": 0.1}, "takes one of"),
    ],
)
def test_routing_params_validation(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RoutingParams(**kwargs)
