"""The reference loop's own token choice: grammar mask, early-stop ban, then one draw.

Written from the daemon's definition of sampling, not from its code (trd/engines/
sampler.py, trd/rng.py, trd/engines/constrain.py), one request and one position at a
time, so an oracle test compares two independent implementations:

    greedy      temperature below GREEDY_BELOW: the first index of the largest logit
    sampled     p = softmax(logits / temperature) (float64 here); the tokens in order of
                decreasing p (ties: lower id first) are kept while fewer than top_k (0: no
                limit) came before and the mass strictly above a token is below top_p;
                the first token is always kept. u = uniform(seed or 0, position), the
                token whose running sum of kept p first exceeds u * (the kept mass)
    uniform     splitmix64(splitmix64(seed) XOR position), its top 53 bits / 2^53
    min_tokens  while fewer outputs than min_tokens: eos (unless ignore_eos) and the
                stop ids are not allowed
    grammar     the allowed tokens are those llguidance's matcher, fed the committed
                output, gives a non-zero logit bias; the others (and ids past its
                vocabulary) are not allowed. Nothing allowed: the request fails

`position` is the index of the token being made in prompt + output.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path

import torch
from llguidance import LLMatcher, LLTokenizer

from trd.protocol import GREEDY_BELOW, SamplingParams

MASK64 = 0xFFFF_FFFF_FFFF_FFFF


def splitmix64(x: int) -> int:
    """Steele, Lea and Flood's SplitMix64 finaliser of x + the golden-ratio increment."""
    z = (x + 0x9E37_79B9_7F4A_7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & MASK64
    return z ^ (z >> 31)


def uniform(seed: int, position: int) -> float:
    """A number in [0, 1) from (seed, position) alone."""
    bits = splitmix64(splitmix64(seed) ^ position)
    return (bits >> 11) / float(1 << 53)


def draw(logits: torch.Tensor, params: SamplingParams, position: int) -> int:
    """The token of one row of logits (V,), already masked and banned."""
    if params.temperature < GREEDY_BELOW:
        return int(torch.argmax(logits))
    p = torch.softmax(logits.double() / params.temperature, dim=0)
    values, order = (t.tolist() for t in torch.sort(p, descending=True, stable=True))
    kept: list[tuple[int, float]] = []
    above = 0.0  # the mass of the tokens before this one
    for token, q in zip(order[: params.top_k or None], values, strict=False):
        if kept and above >= params.top_p:
            break
        kept.append((token, q))
        above += q
    target = uniform(params.seed or 0, position) * sum(q for _, q in kept)
    running = 0.0
    for token, q in kept:
        running += q
        if running > target:
            return token
    return kept[-1][0]


def stop_ids(params: SamplingParams, eos: Sequence[int], outputs: int) -> list[int]:
    """The ids that may not come next because the output is shorter than min_tokens."""
    if outputs >= params.min_tokens:
        return []
    return [*params.stop_token_ids, *([] if params.ignore_eos else eos)]


@cache
def _tokenizer(tokenizer_json: str, eos: tuple[int, ...]) -> LLTokenizer:
    return LLTokenizer(
        Path(tokenizer_json).read_text(encoding="utf-8"), eos_token=list(eos) or None
    )


class GrammarMask:
    """One request's grammar over the committed output: which tokens may come next."""

    def __init__(self, tokenizer_json: Path, eos: Sequence[int], grammar: str) -> None:
        self.matcher = LLMatcher(_tokenizer(str(tokenizer_json), tuple(eos)), grammar, log_level=0)
        self.fed = 0

    def allowed(self, output: Sequence[int], banned: Sequence[int], width: int) -> torch.Tensor:
        """(width,) bool: may each token come after `output`? All False: nothing may."""
        if self.fed < len(output):
            self.matcher.consume_tokens(list(output[self.fed :]))
            self.fed = len(output)
        ok = torch.zeros(width, dtype=torch.bool)
        if self.matcher.is_error():
            return ok
        bias = self.matcher.compute_logit_bias()
        n = min(width, len(bias))
        ok[:n] = torch.frombuffer(bytearray(bias[:n]), dtype=torch.uint8) != 0
        ok[[t for t in banned if t < width]] = False
        return ok

    def why_not(self) -> str:
        return self.matcher.get_error() or "every token is forbidden"
