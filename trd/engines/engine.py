"""A single-model engine: scheduler + model runner + sampler, stepped by the caller.

    engine = Engine(EngineSpec.of("models/small", dtype="float32"))
    rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=8))
    while engine.has_unfinished():
        for out in engine.step(): ...

The routing engine builds on `forward()`/`commit()`: it runs the forward, lets a policy
decide what is committed, and commits that. A request whose data makes the forward or
sampling fail is reported in `StepResult.failed`; the rest of its batch goes on.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trd.engines.constrain import Constraints
from trd.engines.pages import PageAllocator
from trd.engines.prefix_cache import PrefixCache
from trd.engines.request import Request, State
from trd.engines.runner import ForwardOutput, ModelRunner
from trd.engines.sampler import ban_early_stops, sample_tensor
from trd.engines.scheduler import Scheduled, Scheduler
from trd.engines.spec import EngineSpec
from trd.engines.speculate import Speculator, Verified
from trd.engines.step import StepResult, TokenLogprobs
from trd.protocol import FinishReason, SamplingParams

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TokenOutput:
    rid: int
    token: int  # -1 when the request failed
    finish: FinishReason
    error: str = ""
    logprobs: TokenLogprobs | None = None  # when the request's SamplingParams ask


class Engine:
    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.runner = ModelRunner(spec)
        self.cfg = spec.checkpoint.config
        pool = PrefixCache if spec.settings.prefix_cache else PageAllocator
        self.scheduler = Scheduler(
            pool(spec.kv_pages, spec.settings.page_size), spec.settings, spec.context
        )
        self._rids = itertools.count()
        self.constraints = Constraints(
            spec.checkpoint.path, self.cfg.eos_token_ids, spec.settings.grammar_cache
        )
        self.speculator = Speculator.of(spec)  # None without a draft model

    # -- requests ---------------------------------------------------------------------
    def add_request(
        self,
        prompt: Sequence[int],
        params: SamplingParams | None = None,
        rid: int | None = None,
        prompt_len: int | None = None,
    ) -> int:
        """Queue a request; raises RequestTooLarge or ValueError when it can never run.

        `prompt_len` < len(prompt) when a peer hands over a request with committed output
        after its prompt: max_tokens counts from the prompt's end, not from here."""
        params = params or SamplingParams()
        if not prompt:
            raise ValueError("prompt must contain at least one token")
        vocab = self.spec.checkpoint.vocab_limit  # the tokenizer's ids; padding rows excluded
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {vocab}): {bad[:5]}")
        if params.temperature > 0 and params.seed is None:
            # Randomness is a function of (seed, position): fix the seed once, here.
            params = dataclasses.replace(params, seed=random.getrandbits(63))
        rid = next(self._rids) if rid is None else rid
        if rid in self.scheduler.requests:
            raise ValueError(f"request id {rid} is already active")
        prompt_len = len(prompt) if prompt_len is None else prompt_len
        if not 1 <= prompt_len <= len(prompt):
            raise ValueError(f"prompt_len must be in [1, {len(prompt)}], got {prompt_len}")
        req = Request(rid, list(prompt), prompt_len, params, arrival=time.monotonic())
        self.scheduler.add(req)
        return rid

    def abort(self, rid: int) -> bool:
        req = self.scheduler.requests.get(rid)
        if req is None:
            return False
        req.finish = FinishReason.ABORT
        self.scheduler.finish(req)
        return True

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.requests)

    # -- stepping ---------------------------------------------------------------------
    def schedule(self) -> list[Scheduled]:
        return self.scheduler.schedule()

    def speculate(self, batch: list[Scheduled]) -> list[Verified] | None:
        """The batch's speculative step (trd/engines/speculate.py), or None when it does not
        speculate (no draft model, or a request that does not qualify): `forward` then."""
        if self.speculator is None:
            return None
        try:
            return self.speculator.step(self.runner, self.scheduler, batch)
        except Exception:
            # Nothing committed and no KV of this model kept: the plain step serves the
            # batch (each request alone if it fails); the draft starts over.
            log.exception("speculative step failed for %d requests: a plain step", len(batch))
            for item in batch:
                item.req.draft_kv = 0
            return None

    @torch.inference_mode()
    def forward(self, batch: list[Scheduled] | None = None) -> StepResult | None:
        """Run one batch (the scheduler's next, unless given); advance anchors; sample a
        candidate for each completed feed."""
        batch = self.scheduler.schedule() if batch is None else batch
        if not batch:
            return None
        out, failed = self._run(batch)
        broken = {id(req) for req, _ in failed}
        for item in batch:
            if id(item.req) in broken:
                continue  # nothing was computed: no KV for the cache to keep
            item.req.kv_len += item.num_tokens
            item.req.fed_tokens += item.num_tokens
            if item.req.prefill_only and self.scheduler.ahead_left(item.req) <= 0:
                self.scheduler.finish(item.req)  # its prompt's blocks: cache entries now
        finite = torch.isfinite(out.logits).all(dim=-1)  # before bans set -inf on purpose
        reqs = [item.req for item in out.items]
        params = [r.params for r in reqs]
        # The grammar masks come first: sampling and the routing policy read masked logits.
        refused = self.constraints.apply(reqs, out.logits)
        masked = any(p.grammar for p in params)
        eos = self.cfg.eos_token_ids
        banned = ban_early_stops(out.logits, params, [r.num_output for r in reqs], eos)
        positions = [len(r.seq) for r in reqs]
        greedy = None if banned or masked else out.greedy
        tokens = sample_tensor(out.logits, params, positions, greedy)
        fed = sum(i.num_tokens for i in batch)
        return StepResult(out, tokens, finite, len(batch), fed, failed, refused)

    def _run(self, batch: list[Scheduled]) -> tuple[ForwardOutput, list[tuple[Request, str]]]:
        """The batch's forward; if it raises, each request alone, so one bad one fails alone."""
        try:
            return self.runner.forward(batch), []
        except Exception as exc:
            if len(batch) == 1:
                log.exception("forward failed for request %x", batch[0].req.rid)
                return self.runner.empty_output(), [(batch[0].req, f"forward failed: {exc}")]
        outs, failed = [], []
        for item in batch:
            try:
                outs.append(self.runner.forward([item]))
            except Exception as exc:
                log.exception("forward failed for request %x", item.req.rid)
                failed.append((item.req, f"forward failed: {exc}"))
        return ForwardOutput.concat(outs, self.runner.empty_output()), failed

    def commit(self, req: Request, tokens: Sequence[int]) -> FinishReason:
        """Append committed tokens, stopping at the first stop condition; finish if met."""
        for token in tokens:
            req.seq.append(token)
            reason = self.stop_reason(req, token)
            if reason is not FinishReason.NONE:
                req.finish = reason
                self.scheduler.finish(req)
                return reason
        return FinishReason.NONE

    def _commit_verified(self, v: Verified) -> list[TokenOutput]:
        if v.error:
            self.scheduler.finish(v.req)
            return [TokenOutput(v.req.rid, -1, FinishReason.ERROR, v.error)]
        reason = self.commit(v.req, v.tokens)
        n = len(v.req.seq) - v.base
        return [
            TokenOutput(v.req.rid, t, reason if i == n - 1 else FinishReason.NONE)
            for i, t in enumerate(v.req.seq[v.base :])
        ]

    def stop_reason(self, req: Request, token: int) -> FinishReason:
        p = req.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.cfg.eos_token_ids):
            return FinishReason.STOP
        if req.num_output >= p.max_tokens:
            return FinishReason.LENGTH
        return FinishReason.NONE

    def step(self) -> list[TokenOutput]:
        """Single-model semantics: every sampled token is committed (a speculative step's
        several, one TokenOutput each)."""
        batch = self.schedule()
        verified = self.speculate(batch) if batch else None
        if verified is not None:
            return [out for v in verified for out in self._commit_verified(v)]
        result = self.forward(batch)
        if result is None:
            return []
        outputs = []
        for req, error in result.failed:
            self.scheduler.finish(req)
            outputs.append(TokenOutput(req.rid, -1, FinishReason.ERROR, error))
        host = result.resolve()
        for req, token, lp in zip(host.requests, host.tokens, host.logprobs, strict=True):
            outputs.append(TokenOutput(req.rid, token, self.commit(req, [token]), logprobs=lp))
        return outputs

    def run(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | None = None
    ) -> list[list[TokenOutput]]:
        """Run prompts to completion together; each one's outputs (a failure raises)."""
        rids = [self.add_request(p, params) for p in prompts]
        outs: dict[int, list[TokenOutput]] = {rid: [] for rid in rids}
        while self.has_unfinished():
            for o in self.step():
                if o.finish is FinishReason.ERROR:
                    raise RuntimeError(f"request {o.rid} failed: {o.error}")
                outs[o.rid].append(o)
        return [outs[rid] for rid in rids]

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | None = None
    ) -> list[list[int]]:
        """Run prompts to completion together; return each one's output tokens."""
        return [[o.token for o in outs] for outs in self.run(prompts, params)]

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()
        for req in self.scheduler.requests.values():
            if req.state is State.FINISHED:
                raise AssertionError(f"finished request {req.rid} still registered")
