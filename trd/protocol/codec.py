"""The binary codec of the messages in `messages`.

A frame is a one-byte type tag, a version byte,
a fixed little-endian struct header and then the variable parts (numpy arrays as raw
bytes, strings as utf-8), in the order drawn below. No pickle: a frame from a peer on
another host is untrusted input, and `decode` turns every malformed frame into a
`ProtocolError`.

    params block P (67 B):  max_tokens u32 | temperature f64 | top_p f64 | top_k u32
                            | seed i64 (-1 = None) | ignore_eos u8 | min_tokens u32
                            | logprobs i8 (-1 = None) | priority i32
                            | large_share f64 | threshold f64 (NaN = None)
                            | model u8 (255 = None) | n_stop u32 | n_grammar u32
                            then stop_token_ids i32[n_stop] | grammar utf-8[n_grammar]

    Submit  (tag 1):  tag u8 | ver u8 | rid u64 | n_prompt u32 | P | prompt i32[n_prompt]
    PeerReq (tag 2):  tag u8 | ver u8 | rid u64 | handoff_seq u32
                      | kind u8 | loc u32 | prompt_len u32 | sent_at f64 | n_tokens u32
                      | n_extra u32 | has_params u8 | n_anchors u8 | large u32
                      | tau f64 (NaN = None) | [P if has_params] | tokens i32[n_tokens]
                      | anchors u32[n_anchors] | extra u8[n_extra]
    Emit    (tag 3):  tag u8 | ver u8 | rid u64 | pos u32 | finish u8 | n u32 | n_error u32
                      | has_logprobs u8 | k u8 | tokens i32[n] | models u8[n]
                      | [logprobs f32[n] | top_ids i32[n*k] | top_logprobs f32[n*k]
                         if has_logprobs] | error utf-8[n_error]
    Abort   (tag 4):  tag u8 | ver u8 | rid u64
    Ready   (tag 5):  tag u8 | ver u8 | model u8 | pid u32 | kv_pages u32 | page_size u32
                      | n_error u32 | error utf-8[n_error]
    Done    (tag 6):  tag u8 | ver u8 | rid u64 | model u8 | fed_tokens u32 | forwards u32
                      | holders u64 | n_lat u32 | handoff_latencies f32[n_lat]
    Stats   (tag 7):  tag u8 | ver u8 | model u8 | n u32 | body utf-8 JSON[n]
    Control (tag 8):  tag u8 | ver u8 | n u32 | body utf-8 JSON[n]
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

import numpy as np

from trd.protocol.messages import (
    MAX_EXTRA,
    MAX_MODELS,
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
)

# 2: min_tokens in the params block; 3: logprobs; 4: grammar; 5: priority and routing in
# the params block, the routing state in PeerReq
VERSION = 5
_T_SUBMIT, _T_PEER, _T_EMIT, _T_ABORT, _T_READY, _T_DONE = 1, 2, 3, 4, 5, 6
_T_STATS, _T_CONTROL = 7, 8
# The params block's fixed fields in wire order. The front end derives its request
# limits from these widths (trd.frontend.openai_api), so whatever it accepts fits here.
PARAMS_LAYOUT: dict[str, str] = {
    "max_tokens": "I", "temperature": "d", "top_p": "d", "top_k": "I", "seed": "q",
    "ignore_eos": "B", "min_tokens": "I", "logprobs": "b", "priority": "i",
    "large_share": "d", "threshold": "d", "model": "B", "n_stop": "I", "n_grammar": "I",
}  # fmt: skip
_NO_MODEL = MAX_MODELS  # RoutingParams.model None on the wire
TOKEN_ID = "i"  # prompt and stop token ids
_PARAMS = struct.Struct("<" + "".join(PARAMS_LAYOUT.values()))
_SUBMIT = struct.Struct("<BBQI")
_PEER = struct.Struct("<BBQIBIIdIIBBId")
_EMIT = struct.Struct("<BBQIBIIBB")
_ABORT = struct.Struct("<BBQ")
_READY = struct.Struct("<BBBIIII")
_DONE = struct.Struct("<BBQBIIQI")
_STATS = struct.Struct("<BBBI")
_CONTROL = struct.Struct("<BBI")
_I32 = np.dtype(np.int32)
_U32 = np.dtype(np.uint32)
_U8 = np.dtype(np.uint8)
_F32 = np.dtype(np.float32)
_SENT_AT = struct.Struct("<d")
_SENT_AT_OFFSET = struct.calcsize("<BBQIBII")  # PeerReq.sent_at within its frame
_PEER_KINDS = {k.value: k for k in PeerKind}
_FINISH_REASONS = {f.value: f for f in FinishReason}


def int_range(code: str) -> tuple[int, int]:
    """The integers a struct format code carries: "I" -> (0, 2**32 - 1), "q" -> ±2**63."""
    bits = 8 * struct.calcsize(code)
    if code.islower():  # b h i l q: signed
        return -(1 << bits - 1), (1 << bits - 1) - 1
    return 0, (1 << bits) - 1


def _raw(name: str, arr: np.ndarray, dtype: np.dtype = _I32) -> bytes:
    if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.ndim != 1:
        raise ProtocolError(f"{name} must be a 1-D {dtype} numpy array, got {arr!r:.80}")
    return arr.tobytes()


def _opt(x: float | None) -> float:
    return math.nan if x is None else x


def _enc_params(p: SamplingParams) -> bytes:
    seed = -1 if p.seed is None else p.seed
    logprobs = -1 if p.logprobs is None else p.logprobs
    n = len(p.stop_token_ids)
    grammar = p.grammar.encode()
    r = p.routing
    model = _NO_MODEL if r.model is None else r.model
    head = _PARAMS.pack(
        p.max_tokens, p.temperature, p.top_p, p.top_k, seed, p.ignore_eos, p.min_tokens,
        logprobs, p.priority, _opt(r.large_share), _opt(r.threshold), model, n, len(grammar),
    )  # fmt: skip
    return head + struct.pack(f"<{n}{TOKEN_ID}", *p.stop_token_ids) + grammar


def _enc_submit(m: Submit) -> bytes:
    if len(m.prompt) == 0:
        raise ProtocolError("Submit.prompt must not be empty")
    head = _SUBMIT.pack(_T_SUBMIT, VERSION, m.rid, len(m.prompt))
    return head + _enc_params(m.params) + _raw("Submit.prompt", m.prompt)


def _enc_peer(m: PeerReq) -> bytes:
    if len(m.extra) > MAX_EXTRA:
        raise ProtocolError(f"PeerReq.extra is {len(m.extra)} bytes, limit {MAX_EXTRA}")
    tokens, anchors = _raw("PeerReq.tokens", m.tokens), _raw("PeerReq.anchors", m.anchors, _U32)
    if len(m.anchors) > MAX_MODELS:
        raise ProtocolError(f"PeerReq.anchors has {len(m.anchors)} entries, limit {MAX_MODELS}")
    head = _PEER.pack(
        _T_PEER, VERSION, m.rid, m.handoff_seq, m.kind, m.loc, m.prompt_len,
        m.sent_at, len(m.tokens), len(m.extra), m.params is not None, len(m.anchors),
        m.large, m.tau,
    )  # fmt: skip
    params = b"" if m.params is None else _enc_params(m.params)
    return b"".join((head, params, tokens, anchors, m.extra))


def _enc_emit(m: Emit) -> bytes:
    tokens, models = _raw("Emit.tokens", m.tokens), _raw("Emit.models", m.models, _U8)
    if m.models.shape != m.tokens.shape:
        raise ProtocolError(f"Emit.models {m.models.shape} != Emit.tokens {m.tokens.shape}")
    error, n = m.error.encode(), len(m.tokens)
    if m.logprobs is None:
        head = _EMIT.pack(_T_EMIT, VERSION, m.rid, m.pos, m.finish, n, len(error), 0, 0)
        return b"".join((head, tokens, models, error))
    if m.top_ids is None or m.top_logprobs is None:
        raise ProtocolError("Emit.logprobs needs Emit.top_ids and Emit.top_logprobs")
    k = len(m.top_ids) // n if n else 0
    if m.logprobs.shape != (n,) or m.top_ids.shape != (n * k,) or len(m.top_logprobs) != n * k:
        raise ProtocolError(f"Emit log-probabilities do not fit {n} tokens")
    arrays = (
        _raw("Emit.logprobs", m.logprobs, _F32),
        _raw("Emit.top_ids", m.top_ids),
        _raw("Emit.top_logprobs", m.top_logprobs, _F32),
    )
    head = _EMIT.pack(_T_EMIT, VERSION, m.rid, m.pos, m.finish, n, len(error), 1, k)
    return b"".join((head, tokens, models, *arrays, error))


def _enc_abort(m: Abort) -> bytes:
    return _ABORT.pack(_T_ABORT, VERSION, m.rid)


def _enc_ready(m: Ready) -> bytes:
    error = m.error.encode()
    head = _READY.pack(_T_READY, VERSION, m.model, m.pid, m.kv_pages, m.page_size, len(error))
    return head + error


def _enc_done(m: Done) -> bytes:
    lat = _raw("Done.handoff_latencies", m.handoff_latencies, _F32)
    n = len(m.handoff_latencies)
    head = _DONE.pack(_T_DONE, VERSION, m.rid, m.model, m.fed_tokens, m.forwards, m.holders, n)
    return head + lat


def _enc_stats(m: Stats) -> bytes:
    body = m.body.encode()
    return _STATS.pack(_T_STATS, VERSION, m.model, len(body)) + body


def _enc_control(m: Control) -> bytes:
    body = m.body.encode()
    return _CONTROL.pack(_T_CONTROL, VERSION, len(body)) + body


_ENCODERS: dict[type, Callable[..., bytes]] = {
    Stats: _enc_stats,
    Control: _enc_control,
    Submit: _enc_submit,
    PeerReq: _enc_peer,
    Emit: _enc_emit,
    Abort: _enc_abort,
    Ready: _enc_ready,
    Done: _enc_done,
}


def encode(msg: Message) -> bytes:
    """Serialise a message into one frame; ProtocolError if a field does not fit the wire."""
    enc = _ENCODERS.get(type(msg))
    if enc is None:
        raise ProtocolError(f"cannot encode {type(msg).__name__}")
    try:
        return enc(msg)
    except (struct.error, UnicodeEncodeError) as e:
        raise ProtocolError(f"cannot encode {type(msg).__name__}: {e}") from e


def restamp(frame: bytes, shift: float) -> bytes:
    """`frame` with `shift` added to its sent_at if it is a PeerReq; others unchanged.

    sent_at is a perf_counter reading of the sender's host, meaningless on another host:
    a link turns it into an age on the way out and back into a local time on the way in.
    """
    if len(frame) < _PEER.size or frame[0] != _T_PEER or frame[1] != VERSION:
        return frame
    out = bytearray(frame)
    (sent_at,) = _SENT_AT.unpack_from(out, _SENT_AT_OFFSET)
    _SENT_AT.pack_into(out, _SENT_AT_OFFSET, sent_at + shift)
    return bytes(out)


def _array(buf: memoryview, off: int, n: int, dtype: np.dtype) -> tuple[np.ndarray, int]:
    end = off + n * dtype.itemsize
    if end > len(buf):
        raise ProtocolError(f"truncated frame: array needs {end} bytes, frame has {len(buf)}")
    return np.frombuffer(buf, dtype, n, off).copy(), end


def _utf8(buf: memoryview, off: int, n: int, name: str) -> tuple[str, int]:
    end = off + n
    if end > len(buf):
        raise ProtocolError(f"truncated frame: {name} needs {end} bytes, frame has {len(buf)}")
    try:
        return str(buf[off:end], "utf-8"), end
    except UnicodeDecodeError as e:
        raise ProtocolError(f"{name} is not utf-8: {e}") from e


def _dec_params(buf: memoryview, off: int) -> tuple[SamplingParams, int]:
    if off + _PARAMS.size > len(buf):
        raise ProtocolError(f"truncated frame: sampling params end past {len(buf)} bytes")
    (max_tokens, temp, top_p, top_k, seed, ignore_eos, min_tokens, logprobs, priority, share,
     threshold, model, n_stop, n_grammar) = _PARAMS.unpack_from(buf, off)  # fmt: skip
    off += _PARAMS.size
    end = off + 4 * n_stop
    if end > len(buf):
        raise ProtocolError(f"truncated frame: stop ids need {end} bytes, frame has {len(buf)}")
    grammar, after = _utf8(buf, end, n_grammar, "SamplingParams.grammar")
    if ignore_eos > 1:
        raise ProtocolError(f"bad ignore_eos byte {ignore_eos}")
    try:
        routing = RoutingParams(
            None if math.isnan(share) else share, None if math.isnan(threshold) else threshold,
            None if model == _NO_MODEL else model,
        )  # fmt: skip
        params = SamplingParams(
            max_tokens, temp, top_p, top_k, None if seed == -1 else seed,
            struct.unpack_from(f"<{n_stop}{TOKEN_ID}", buf, off), bool(ignore_eos), min_tokens,
            None if logprobs == -1 else logprobs, grammar, routing, priority,
        )  # fmt: skip
    except ValueError as e:
        raise ProtocolError(f"invalid sampling params: {e}") from e
    return params, after


def _dec_submit(buf: memoryview) -> tuple[Message, int]:
    _, _, rid, n_prompt = _SUBMIT.unpack_from(buf)
    if n_prompt == 0:
        raise ProtocolError("Submit.prompt is empty")
    params, off = _dec_params(buf, _SUBMIT.size)
    prompt, off = _array(buf, off, n_prompt, _I32)
    return Submit(rid, prompt, params), off


def _dec_peer(buf: memoryview) -> tuple[Message, int]:
    (_, _, rid, seq, kind, loc, prompt_len, sent_at, n_tok, n_extra, has_params,
     n_anchors, large, tau) = _PEER.unpack_from(buf)  # fmt: skip
    if kind not in _PEER_KINDS:
        raise ProtocolError(f"bad PeerKind {kind}")
    if n_extra > MAX_EXTRA:
        raise ProtocolError(f"PeerReq.extra is {n_extra} bytes, limit {MAX_EXTRA}")
    if has_params > 1:
        raise ProtocolError(f"bad has_params byte {has_params}")
    params, off = _dec_params(buf, _PEER.size) if has_params else (None, _PEER.size)
    tokens, off = _array(buf, off, n_tok, _I32)
    anchors, off = _array(buf, off, n_anchors, _U32)
    end = off + n_extra
    if end > len(buf):
        raise ProtocolError(f"truncated frame: extra needs {end} bytes, frame has {len(buf)}")
    extra = bytes(buf[off:end])
    msg = PeerReq(rid, seq, _PEER_KINDS[kind], loc, tokens, prompt_len, params, extra, sent_at,
                  anchors, large, tau)  # fmt: skip
    return msg, end


def _dec_emit(buf: memoryview) -> tuple[Message, int]:
    _, _, rid, pos, finish, n, n_error, has_logprobs, k = _EMIT.unpack_from(buf)
    if finish not in _FINISH_REASONS:
        raise ProtocolError(f"bad FinishReason {finish}")
    if has_logprobs > 1:
        raise ProtocolError(f"bad has_logprobs byte {has_logprobs}")
    tokens, off = _array(buf, _EMIT.size, n, _I32)
    models, off = _array(buf, off, n, _U8)
    msg = Emit(rid, pos, tokens, models, _FINISH_REASONS[finish])
    if has_logprobs:
        msg.logprobs, off = _array(buf, off, n, _F32)
        msg.top_ids, off = _array(buf, off, n * k, _I32)
        msg.top_logprobs, off = _array(buf, off, n * k, _F32)
    msg.error, end = _utf8(buf, off, n_error, "Emit.error")
    return msg, end


def _dec_abort(buf: memoryview) -> tuple[Message, int]:
    return Abort(_ABORT.unpack_from(buf)[2]), _ABORT.size


def _dec_ready(buf: memoryview) -> tuple[Message, int]:
    _, _, model, pid, kv_pages, page_size, n_error = _READY.unpack_from(buf)
    error, end = _utf8(buf, _READY.size, n_error, "Ready.error")
    return Ready(model, pid, kv_pages, page_size, error), end


def _dec_done(buf: memoryview) -> tuple[Message, int]:
    _, _, rid, model, fed_tokens, forwards, holders, n_lat = _DONE.unpack_from(buf)
    lat, end = _array(buf, _DONE.size, n_lat, _F32)
    return Done(rid, model, fed_tokens, forwards, holders, lat), end


def _dec_stats(buf: memoryview) -> tuple[Message, int]:
    _, _, model, n = _STATS.unpack_from(buf)
    body, end = _utf8(buf, _STATS.size, n, "Stats.body")
    return Stats(model, body), end


def _dec_control(buf: memoryview) -> tuple[Message, int]:
    _, _, n = _CONTROL.unpack_from(buf)
    body, end = _utf8(buf, _CONTROL.size, n, "Control.body")
    return Control(body), end


_DECODERS: dict[int, tuple[struct.Struct, Callable[[memoryview], tuple[Message, int]]]] = {
    _T_STATS: (_STATS, _dec_stats),
    _T_CONTROL: (_CONTROL, _dec_control),
    _T_SUBMIT: (_SUBMIT, _dec_submit),
    _T_PEER: (_PEER, _dec_peer),
    _T_EMIT: (_EMIT, _dec_emit),
    _T_ABORT: (_ABORT, _dec_abort),
    _T_READY: (_READY, _dec_ready),
    _T_DONE: (_DONE, _dec_done),
}


def decode(frame: bytes | bytearray | memoryview) -> Message:
    """Parse one frame; any malformed frame raises ProtocolError and nothing else."""
    try:
        buf = memoryview(frame).cast("B")
    except TypeError as e:
        raise ProtocolError(f"frame must be a bytes-like object, got {type(frame).__name__}") from e
    if len(buf) < 2:
        raise ProtocolError(f"truncated frame: {len(buf)} bytes")
    if buf[1] != VERSION:
        raise ProtocolError(f"unsupported protocol version {buf[1]} (expected {VERSION})")
    entry = _DECODERS.get(buf[0])
    if entry is None:
        raise ProtocolError(f"unknown message tag {buf[0]}")
    header, dec = entry
    if len(buf) < header.size:
        raise ProtocolError(f"truncated frame: {len(buf)} bytes, header needs {header.size}")
    msg, end = dec(buf)
    if end != len(buf):
        raise ProtocolError(f"{len(buf) - end} trailing bytes after {type(msg).__name__}")
    return msg
