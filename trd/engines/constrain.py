"""Grammar masks on a step's logits: built on the host, applied on the logits' device.

    Constraints(tokenizer_dir, eos_ids)     one per engine (and per reference loop)
      .sync(req)                            advance req's matcher to its committed output
      .apply(reqs, logits) -> {row: why}    mask the constrained rows in place

The grammar state travels with the request as its committed tokens do: each engine
keeps a matcher per request (`Request.grammar`) and, when the request arrives (new or
handed over) and before each of its forwards, feeds the matcher the committed output
tokens it has not seen. Only committed tokens are ever fed, so a candidate a policy
drops (R-Stitch handing a high-entropy token to the large model, CITER escalating) is
never accepted and needs no rollback.

Where the mask is built and applied, on CPU and GPU alike: the matchers run on the host
and write one int32 row per constrained request (bit t of word t // 32 = token t is
allowed; llguidance's layout) into a host tensor, pinned on a GPU engine, while the
forward's kernels may still be queued. The rows are copied to the logits' device
(non-blocking; B x V/32 words, the only extra transfer), unpacked there with a shift
and an and per bit, and the forbidden logits set to -inf in place, on the logits'
stream. Sampling and the routing policy (which decides on the device) read the masked
logits. Columns past the tokenizer's ids (an embedding's padding rows) are cut off by
the runner already (`vocab_limit`); any past the mask's width are forbidden too.

A request whose grammar allows no next token (or whose committed tokens break it)
is refused for that row: the caller fails it with the library's words, never sampling
an invalid token.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from llguidance import LLMatcher

from trd.engines.request import Request
from trd.grammar.compile import CACHE_SIZE, GrammarError, Grammars

BITS = 32


@dataclass(slots=True)
class GrammarState:
    """A request's matcher on this engine and how many output tokens it has accepted."""

    matcher: LLMatcher
    consumed: int = 0


class Constraints:
    def __init__(
        self, tokenizer_dir: Path, eos_ids: Sequence[int], cache_size: int = CACHE_SIZE
    ) -> None:
        self.tokenizer_dir, self.eos_ids = Path(tokenizer_dir), tuple(eos_ids)
        self.cache_size = cache_size  # compiled grammars kept (engine.grammar_cache)
        self._grammars: Grammars | None = None  # built on the first constrained request
        self.mask_s = 0.0  # seconds spent building and applying masks, for the stats

    @property
    def num_cached(self) -> int:
        """Compiled grammars this engine keeps (0 before its first constrained request)."""
        return 0 if self._grammars is None else len(self._grammars)

    @property
    def grammars(self) -> Grammars:
        if self._grammars is None:
            self._grammars = Grammars(self.tokenizer_dir, self.eos_ids, self.cache_size)
        return self._grammars

    def sync(self, req: Request) -> str | None:
        """Feed req's matcher its unseen committed output; None, or why it cannot go on."""
        if not req.params.grammar:
            return None
        state = req.grammar
        if state is None:
            try:
                state = req.grammar = GrammarState(self.grammars.matcher(req.params.grammar))
            except GrammarError as exc:
                return f"the grammar does not compile: {exc}"
        unseen = req.seq[req.prompt_len + state.consumed :]
        if unseen:
            state.matcher.consume_tokens(unseen)
            state.consumed += len(unseen)
        if state.matcher.is_error():
            return f"the output breaks its grammar: {state.matcher.get_error()}"
        return None

    def apply(self, reqs: Sequence[Request], logits: torch.Tensor) -> dict[int, str]:
        """Mask each constrained row of logits (B, V) in place; the rows refused, and why
        (those rows are left unmasked: their candidates must not be used)."""
        rows = [i for i, req in enumerate(reqs) if req.params.grammar]
        if not rows:
            return {}
        start = time.perf_counter()
        words = -(-self.grammars.vocab_size // BITS)
        host = torch.empty((len(rows), words), dtype=torch.int32,
                           pin_memory=logits.device.type == "cuda")  # fmt: skip
        refused: dict[int, str] = {}
        for j, i in enumerate(rows):
            why = self.sync(reqs[i])
            if why is None:
                matcher = reqs[i].grammar.matcher
                matcher.unsafe_compute_mask_ptr(host[j].data_ptr(), words * 4)
                _ban_early_stops(host[j], reqs[i], self.eos_ids)
                if matcher.is_error() or not host[j].any():
                    why = "the grammar allows no next token: " + (
                        matcher.get_error() or "every token is forbidden"
                    )
            if why is not None:
                refused[i] = why
                host[j] = -1
        self._mask(logits, rows, host)
        self.mask_s += time.perf_counter() - start
        return refused

    @staticmethod
    def _mask(logits: torch.Tensor, rows: list[int], host: torch.Tensor) -> None:
        dev = logits.device
        bitmask = host.to(dev, non_blocking=True)
        shifts = torch.arange(BITS, dtype=torch.int32, device=dev)
        allowed = ((bitmask[:, :, None] >> shifts) & 1).bool().flatten(1)
        width = logits.shape[-1]
        if allowed.shape[1] < width:
            allowed = torch.nn.functional.pad(allowed, (0, width - allowed.shape[1]))
        index = torch.tensor(rows, device=dev)
        logits[index] = logits[index].masked_fill(~allowed[:, :width], -torch.inf)


def _ban_early_stops(row: torch.Tensor, req: Request, eos_ids: Sequence[int]) -> None:
    """Clear the bits of the tokens `ban_early_stops` will ban (eos and stop ids before
    min_tokens), so a grammar that could only end here counts as allowing nothing."""
    p = req.params
    if req.num_output >= p.min_tokens:
        return
    for t in (*p.stop_token_ids, *([] if p.ignore_eos else eos_ids)):
        if t < BITS * row.shape[0]:
            word = int(row[t // BITS]) & ~(1 << (t % BITS)) & 0xFFFFFFFF
            row[t // BITS] = word - (1 << BITS) if word >> (BITS - 1) else word  # as int32
