"""Speculative decoding inside one engine: a draft model proposes, this model verifies.

    spec = Speculator.of(engine_spec)              # None without a draft model
    done = spec.step(runner, scheduler, batch)     # None: this batch does not speculate

A step speculates when every request in it is a greedy decode that stays on this engine
(pinned here by `routing.model`, or the engine serves alone) and asks for nothing a draft
cannot give (no grammar, no log-probabilities, no early-stop ban left). The draft model,
loaded in this process beside the engine's own, catches up on each request's committed
tokens and proposes up to `draft_tokens` greedily; this model feeds the request's unfed
token and the proposals in one forward, takes each proposal while it equals its own
greedy token at that position, then its own token after them.

The tokens are this model's own: its rows over the proposals are computed token by
token (output tokens take the native decode on CPU: `BatchLayout.outputs_from`), so a
speculating engine commits exactly what it commits without a draft, and the draft
decides only how many tokens a step yields. The draft's KV has its own tensors over the
engine's page table (the same page ids), so pages are allocated once for both; a
request's draft KV is forgotten whenever its pages are (`Request.draft_kv`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from trd.engines.request import Request
from trd.engines.runner import ModelRunner
from trd.engines.scheduler import Scheduled, Scheduler
from trd.engines.spec import EngineSpec
from trd.engines.step import NON_FINITE
from trd.models.attention import BatchLayout
from trd.protocol import GREEDY_BELOW


@dataclass(frozen=True, slots=True)
class Verified:
    """One request's outcome of a speculative step."""

    req: Request
    base: int  # len(req.seq) before the step
    tokens: list[int]  # to commit: the accepted proposals, then this model's token
    proposed: int
    fed: int  # tokens this model fed for it
    error: str = ""  # non-empty: this model's logits were not finite; nothing to commit


class Speculator:
    def __init__(self, spec: EngineSpec, draft: ModelRunner) -> None:
        self.index, self.alone = spec.index, spec.num_models == 1
        self.tokens, self.rows = spec.settings.draft_tokens, spec.settings.draft_rows
        self.draft = draft
        self.budget = spec.settings.max_batch_tokens  # draft tokens one catch-up feeds

    @classmethod
    def of(cls, spec: EngineSpec) -> Speculator | None:
        if spec.draft is None:
            return None
        settings = dataclasses.replace(spec.settings, cuda_graphs=False)
        draft_spec = dataclasses.replace(
            spec, name=f"{spec.name}-draft", checkpoint=spec.draft.checkpoint,
            dtype=spec.draft.dtype, quantization=spec.draft.quantization, settings=settings,
            draft=None,
        )  # fmt: skip
        return cls(spec, ModelRunner(draft_spec))

    def takes(self, item: Scheduled) -> bool:
        req, p = item.req, item.req.params
        return (
            item.completes
            and item.num_tokens == 1
            and not req.prefill_only
            and p.temperature < GREEDY_BELOW
            and not p.grammar
            and p.logprobs is None
            and req.num_output >= p.min_tokens
            and (self.alone or p.routing.model == self.index)
        )

    @torch.inference_mode()
    def step(
        self, runner: ModelRunner, scheduler: Scheduler, batch: Sequence[Scheduled]
    ) -> list[Verified] | None:
        """Draft and verify `batch` (scheduled, its pages reserved), or None when it does not
        speculate: some request does not qualify or the drafts find no pages."""
        if not batch or not all(self.takes(item) for item in batch):
            return None
        reqs = [item.req for item in batch]
        per = min(self.tokens, self.rows // len(reqs) - 1)
        if per < 1:
            return None  # too many requests: proposals would cost more than they save
        wants = [self._wanted(req, per) for req in reqs]
        if not all(
            scheduler.reserve_free(r, len(r.seq) + k) for r, k in zip(reqs, wants, strict=True)
        ):
            return None
        drafts = self._propose(reqs, wants)
        return self._verify(runner, reqs, drafts)

    @staticmethod
    def _wanted(req: Request, per: int) -> int:
        """Proposals worth making: no more than the request may still write, less one (this
        model's own token always comes last)."""
        return max(0, min(per, req.params.max_tokens - req.num_output - 1))

    def _propose(self, reqs: list[Request], wants: list[int]) -> list[list[int]]:
        """Up to wants[i] greedy proposals of the draft for each request; its first forward
        catches the draft's KV up on the committed tokens (at most `budget` of them in all:
        a request whose catch-up does not fit gets no proposals this step)."""
        drafts: list[list[int]] = [[] for _ in reqs]
        rows, feeds, short, budget = [], [], set(), self.budget
        for i, (req, k) in enumerate(zip(reqs, wants, strict=True)):
            if k == 0 or budget == 0:
                continue
            lag = req.seq[req.draft_kv :]
            rows.append(i)
            feeds.append(lag[:budget])
            budget -= len(feeds[-1])
            if len(feeds[-1]) < len(lag):
                short.add(i)
        while rows:
            batch = [reqs[i] for i in rows]
            _, greedy = self._run(self.draft, batch, feeds, [r.draft_kv for r in batch], last=True)
            for i, f, t in zip(rows, feeds, greedy.tolist(), strict=True):
                reqs[i].draft_kv += len(f)
                if i not in short:
                    drafts[i].append(int(t))
            rows = [i for i in rows if i not in short and len(drafts[i]) < wants[i]]
            short = set()
            feeds = [[drafts[i][-1]] for i in rows]
        return drafts

    def _verify(
        self, runner: ModelRunner, reqs: list[Request], drafts: list[list[int]]
    ) -> list[Verified]:
        bases = [len(r.seq) for r in reqs]
        feeds = [r.seq[r.kv_len :] + d for r, d in zip(reqs, drafts, strict=True)]
        kv_lens = [r.kv_len for r in reqs]
        logits, greedy = self._run(runner, reqs, feeds, kv_lens, last=False)
        finite = torch.isfinite(logits).all(dim=-1).tolist()
        own, out, row = greedy.tolist(), [], 0
        for req, feed, draft, base, kv in zip(reqs, feeds, drafts, bases, kv_lens, strict=True):
            lag = base - kv  # rows before the one that predicts the first proposal
            mine = own[row + lag - 1 : row + len(feed)]
            ok = all(finite[row + lag - 1 : row + len(feed)])
            row += len(feed)
            req.fed_tokens += len(feed)
            # This model's KV holds the committed tokens and every proposal it fed: valid
            # through the accepted ones; the draft's through what it fed of them.
            accepted = 0
            while accepted < len(draft) and mine[accepted] == draft[accepted]:
                accepted += 1
            req.kv_len = base + accepted
            req.draft_kv = min(req.draft_kv, base + accepted)
            if not ok:
                out.append(Verified(req, base, [], len(draft), len(feed), NON_FINITE))
                continue
            out.append(
                Verified(req, base, [*draft[:accepted], mine[accepted]], len(draft), len(feed))
            )
        return out

    @staticmethod
    def _run(model: ModelRunner, reqs: list[Request], feeds: list[list[int]],
             starts: list[int], last: bool) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """One forward of `model` over each request's feed at its start: the logits and
        greedy tokens of each feed's last row, or of every row."""
        lens = [len(f) for f in feeds]
        layout = BatchLayout(lens, starts, [r.pages for r in reqs], model.page_size,
                             [r.prompt_len for r in reqs])  # fmt: skip
        positions = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
        seq_lens = np.repeat(np.asarray(starts) + np.asarray(lens), lens)
        ends = np.cumsum(lens)
        rows = ends - 1 if last else np.arange(int(ends[-1]))
        ids = np.asarray([t for f in feeds for t in f], np.int64)
        model.timer.start()
        logits, _, greedy = model.run(model.backend, layout, ids, positions, seq_lens, rows)
        model.timer.stop()
        return logits, greedy
