"""A single-model engine: scheduler + model runner + sampler, stepped by the caller.

    engine = Engine("models/small", dtype="float32")
    rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=8))
    while engine.has_unfinished():
        for out in engine.step(): ...

The routing engine process builds on `forward()`/`commit()`: it runs the forward,
lets a policy decide what is committed, and commits that.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trd.engines.pages import PageAllocator
from trd.engines.request import Request, State
from trd.engines.runner import ForwardOutput, ModelRunner
from trd.engines.sampler import sample
from trd.engines.scheduler import Scheduler
from trd.protocol import FinishReason, SamplingParams


@dataclass(frozen=True, slots=True)
class TokenOutput:
    rid: int
    token: int
    finish: FinishReason


@dataclass(frozen=True, slots=True)
class StepResult:
    forward: ForwardOutput
    tokens: list[int]  # sampled candidate per completed item
    batch_size: int  # requests in the forward, completed or not
    fed: int  # tokens fed in the forward

    @property
    def requests(self) -> list[Request]:
        return [item.req for item in self.forward.items]


class Engine:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        kv_tokens: int = 32768,
        page_size: int = 16,
        max_batch_tokens: int = 1024,
        max_batch_size: int = 64,
        max_model_len: int | None = None,
        attention: str = "auto",
        cpu_linear: str = "torch",
    ) -> None:
        num_pages = -(-kv_tokens // page_size)
        self.runner = ModelRunner(
            Path(model_dir),
            dtype=dtype,
            device=device,
            num_pages=num_pages,
            page_size=page_size,
            attention=attention,
            cpu_linear=cpu_linear,
        )
        self.cfg = self.runner.cfg
        limit = self.cfg.max_position_embeddings
        self.scheduler = Scheduler(
            PageAllocator(num_pages, page_size),
            max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size,
            max_model_len=min(max_model_len or limit, limit),
        )
        self._rids = itertools.count()

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
        bad = [t for t in prompt if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids out of range [0, {self.cfg.vocab_size}): {bad[:5]}")
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
    def forward(self) -> StepResult | None:
        """Run one batch; advance anchors; sample a candidate for each completed feed."""
        batch = self.scheduler.schedule()
        if not batch:
            return None
        out = self.runner.forward(batch)
        for item in batch:
            item.req.kv_len += item.num_tokens
            item.req.fed_tokens += item.num_tokens
        reqs = [item.req for item in out.items]
        tokens = sample(out.logits, [r.params for r in reqs], [len(r.seq) for r in reqs])
        return StepResult(out, tokens, len(batch), sum(i.num_tokens for i in batch))

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

    def stop_reason(self, req: Request, token: int) -> FinishReason:
        p = req.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.cfg.eos_token_ids):
            return FinishReason.STOP
        if req.num_output >= p.max_tokens:
            return FinishReason.LENGTH
        return FinishReason.NONE

    def step(self) -> list[TokenOutput]:
        """Single-model semantics: every sampled token is committed."""
        result = self.forward()
        if result is None:
            return []
        outputs = []
        for req, token in zip(result.requests, result.tokens, strict=True):
            outputs.append(TokenOutput(req.rid, token, self.commit(req, [token])))
        return outputs

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | None = None
    ) -> list[list[int]]:
        """Run prompts to completion together; return each one's output tokens."""
        rids = [self.add_request(p, params) for p in prompts]
        outs: dict[int, list[int]] = {rid: [] for rid in rids}
        while self.has_unfinished():
            for o in self.step():
                outs[o.rid].append(o.token)
        return [outs[rid] for rid in rids]

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()
        for req in self.scheduler.requests.values():
            if req.state is State.FINISHED:
                raise AssertionError(f"finished request {req.rid} still registered")
