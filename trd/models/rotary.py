"""Rotary position embedding: inverse frequencies and cos/sin scaling per variant.

Every formula runs in float32, operation for operation in transformers' order
(`modeling_rope_utils.py`), whatever the model dtype: the reference computes its
cos/sin tables in float32 too, and one frequency rounded differently moves the logits
of a float64 run past position ~100 by far more than 1e-9.

    default   inv_i = 1 / theta^(2i/d)
    linear    inv_i / factor
    llama3    wavelength 2 pi / inv_i: above original/low_freq_factor divide by factor,
              below original/high_freq_factor keep, in between interpolate smoothly
    yarn      a ramp over dimensions (by rotations within the original context) blends
              inv_i / factor and inv_i; cos and sin are multiplied by the attention factor
    dynamic   while the sequence fits the original context: default; past it, the base
              becomes theta * (factor * S / original - (factor - 1))^(d / (d - 2))

`dynamic` depends on S, the sequence length at the forward that computes a token.
transformers, for one sequence with a KV cache, recomputes the frequencies whenever a
forward's last position reaches past the longest it has seen, and the cache keeps the
keys rotated with the frequencies of their own forward. Our cache holds post-rope keys
too, so each request's feed is rotated with the frequencies of S = the length of the
sequence that feed catches up to (the whole prompt for every chunk of a prefill, as the
one prefill call transformers makes would), per request within a packed batch.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from trd.models.rope import RopeConfig

_CACHED_LENGTHS = 4096  # dynamic: frequencies kept per sequence length, then recomputed


def _exponents(dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(dim/2,) float32: 0, 2/dim, 4/dim, ..."""
    return torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float32) / dim


def inv_frequencies(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    """The (dim/2,) float32 inverse frequencies (on CPU, as transformers builds them at
    load) and the factor cos and sin are multiplied by."""
    if rope.rope_type == "yarn":
        return _yarn(rope, dim)
    base = rope.theta
    if rope.rope_type == "dynamic":  # transformers' formula at S = original, in Python floats
        f, n = rope.factor, rope.original_context
        base = base * ((f * n / n) - (f - 1)) ** (dim / (dim - 2))
    inv = 1.0 / (base ** _exponents(dim))
    if rope.rope_type == "linear":
        inv = inv / rope.factor
    elif rope.rope_type == "llama3":
        inv = _llama3(rope, inv)
    return inv, 1.0


def _llama3(rope: RopeConfig, inv: torch.Tensor) -> torch.Tensor:
    low_wavelen = rope.original_context / rope.low_freq_factor  # longer: fully scaled
    high_wavelen = rope.original_context / rope.high_freq_factor  # shorter: kept
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
    smooth = (rope.original_context / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    between = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(between, blended, scaled)


def yarn_attention_factor(rope: RopeConfig) -> float:
    if rope.attention_factor is not None:
        return rope.attention_factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.mscale and rope.mscale_all_dim:
        return float(mscale(rope.factor, rope.mscale) / mscale(rope.factor, rope.mscale_all_dim))
    return mscale(rope.factor)


def _yarn(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    base, factor = rope.theta, rope.factor

    def dim_of(rotations: float) -> float:
        """The dimension that turns `rotations` times over the original context."""
        turns = rope.original_context / (rotations * 2 * math.pi)
        return (dim * math.log(turns)) / (2 * math.log(base))

    low, high = dim_of(rope.beta_fast), dim_of(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of width zero would divide by zero
    dims = torch.arange(dim // 2, dtype=torch.float32, device="cpu")
    ramp = ((dims - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** _exponents(dim)
    extrapolated, interpolated = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1: the dimension keeps its original frequency
    inv = interpolated * (1 - keep) + extrapolated * keep
    return inv, yarn_attention_factor(rope)


def dynamic_inv_frequencies(
    rope: RopeConfig, dim: int, seq_len: int, device: torch.device
) -> torch.Tensor:
    """dynamic's frequencies for a forward reaching sequence length `seq_len`.

    transformers computes these from a 0-d int64 tensor, so the base is a float32
    tensor (not a Python float): the same here, on the model's device as there."""
    s = torch.tensor(seq_len, dtype=torch.int64, device=device)
    s = torch.maximum(s, torch.tensor(rope.original_context, dtype=s.dtype, device=device))
    grown = (rope.factor * s / rope.original_context) - (rope.factor - 1)
    base = rope.theta * grown ** (dim / (dim - 2))
    return 1.0 / (base ** _exponents(dim, device))


class RotaryEmbedding:
    """cos/sin (T, D) for the tokens of a packed batch, in the model dtype."""

    def __init__(self, rope: RopeConfig, dim: int, device: torch.device) -> None:
        self.rope, self.dim, self.device = rope, dim, device
        inv, self.scale = inv_frequencies(rope, dim)
        self.inv = inv.to(device)
        self._dynamic: dict[int, torch.Tensor] = {}

    def cos_sin(
        self, positions: torch.Tensor, seq_lens: np.ndarray, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (T,) on the device; seq_lens (T,): the sequence length each token's
        feed catches up to (only `dynamic` reads it)."""
        inv = self.inv[None, :]  # (1, D/2)
        if self.rope.rope_type == "dynamic":
            inv = self._per_token(seq_lens)  # (T, D/2)
        freqs = positions[:, None].to(torch.float32) * inv  # (T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (T, D)
        return (emb.cos() * self.scale).to(dtype), (emb.sin() * self.scale).to(dtype)

    def cos_signed_sin(
        self, positions: torch.Tensor, seq_lens: np.ndarray, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(T, 1, D) cos and sin, the sine's first half negated: rotating a head is then
        x * cos + swap_halves(x) * sin, the same numbers as -x2 * sin, x1 * sin."""
        cos, sin = self.cos_sin(positions, seq_lens, dtype)
        half = sin.shape[-1] // 2
        return cos[:, None, :], torch.cat((-sin[:, None, :half], sin[:, None, half:]), dim=-1)

    def _per_token(self, seq_lens: np.ndarray) -> torch.Tensor:
        inv = self.inv.expand(len(seq_lens), -1)
        longer = np.unique(seq_lens[seq_lens > self.rope.original_context])
        if not len(longer):
            return inv
        inv = inv.clone()
        for s in longer.tolist():
            rows = torch.from_numpy(np.flatnonzero(seq_lens == s)).to(self.device)
            inv[rows] = self._at(s)
        return inv

    def _at(self, seq_len: int) -> torch.Tensor:
        inv = self._dynamic.get(seq_len)
        if inv is None:
            if len(self._dynamic) >= _CACHED_LENGTHS:
                self._dynamic.clear()
            inv = dynamic_inv_frequencies(self.rope, self.dim, seq_len, self.device)
            self._dynamic[seq_len] = inv
        return inv
