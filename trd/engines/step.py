"""What one forward produced, and its one copy from the device to the host.

    StepResult (device)                         HostStep (host, after `resolve`)
    forward.logits (B, V), hidden, greedy       requests  rows whose candidate is usable
    sampled (B,)  finite (B,)                   tokens    their candidates
    + the policy's RouteBatch (dst, commit)     routes    their routes
                                                logprobs  theirs, where the request asks
                                                failed    forward errors, non-finite rows,
                                                          rows their grammar refused

`resolve` stacks the candidates, the finite flags and (when the policy decided on the
device) the destinations and commit flags into one tensor and copies that: the step's
only device->host transfer, besides a second one for the log-probabilities of the rows
whose requests ask for them (SamplingParams.logprobs). Rows with non-finite logits are
sampled and routed like the others (the result is discarded) so that no host decision is
needed before the copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from trd.engines.request import Request
from trd.engines.runner import ForwardOutput
from trd.policies.base import Route, RouteBatch, StepView

NON_FINITE = "the model produced non-finite logits (NaN or inf)"


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """A candidate's log-probability under the model that made it, and the model's most
    likely tokens (as many as the request's SamplingParams.logprobs)."""

    logprob: float
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass(frozen=True, slots=True)
class HostStep:
    requests: list[Request]  # the rows with a usable candidate, in batch order
    tokens: list[int]
    routes: list[Route]  # one per request; empty when no routes were resolved
    failed: list[tuple[Request, str]]
    logprobs: list[TokenLogprobs | None]  # one per request; None where not asked


@dataclass(slots=True)
class StepResult:
    forward: ForwardOutput  # every completed feed, in batch order
    sampled: torch.Tensor  # (B,) candidate per row, on the device
    finite: torch.Tensor  # (B,) bool: the row's logits are all finite
    batch_size: int  # requests in the forward, completed or not
    fed: int  # tokens fed in the forward
    errors: list[tuple[Request, str]]  # requests whose forward failed, and why
    refused: dict[int, str] = field(default_factory=dict)  # rows whose grammar refused, why
    _host: HostStep | None = field(default=None, repr=False)

    @property
    def rows(self) -> list[Request]:
        """Every completed row's request, usable or not (what the policy routes)."""
        return [item.req for item in self.forward.items]

    def view(self) -> StepView:
        return StepView(self.forward.logits, self.forward.hidden, self.sampled)

    def resolve(self, routes: RouteBatch | Sequence[Route | None] | None = None) -> HostStep:
        """Copy the step to the host (once); `routes` come from the policy, one per row,
        None for a row whose routing failed (that row is left out)."""
        if self._host is not None:
            return self._host
        parts = [self.sampled, self.finite.long()]
        if isinstance(routes, RouteBatch):
            parts += [routes.dst.long(), routes.commit.long()]
        host = torch.stack(parts).tolist() if len(self.rows) else [[] for _ in parts]
        if isinstance(routes, RouteBatch):
            row_routes: list[Route | None] = [
                Route(d, bool(c)) for d, c in zip(host[2], host[3], strict=True)
            ]
        else:
            row_routes = list(routes) if routes is not None else [None] * len(self.rows)
        row_lps = self._logprobs()
        reqs, tokens, kept, failed = [], [], [], list(self.errors)
        lps: list[TokenLogprobs | None] = []
        rows = zip(self.rows, host[0], host[1], row_routes, row_lps, strict=True)
        for i, (req, token, ok, route, lp) in enumerate(rows):
            if route is None and routes is not None:
                continue  # its routing failed; the router has failed the request
            if not ok or i in self.refused:
                failed.append((req, self.refused.get(i, NON_FINITE)))
            else:
                reqs.append(req)
                tokens.append(token)
                lps.append(lp)
                kept.extend([route] if route is not None else [])
        self._host = HostStep(reqs, tokens, kept, failed, lps)
        return self._host

    def _logprobs(self) -> list[TokenLogprobs | None]:
        """Per row: its candidate's log-probability and top tokens, if its request asks."""
        asked = [i for i, req in enumerate(self.rows) if req.params.logprobs is not None]
        out: list[TokenLogprobs | None] = [None] * len(self.rows)
        if not asked:
            return out
        logits = self.forward.logits
        index = torch.tensor(asked, device=logits.device)
        lp = torch.log_softmax(
            logits[index].to(torch.promote_types(logits.dtype, torch.float32)), -1
        )
        chosen = lp.gather(1, self.sampled[index].long()[:, None])[:, 0]
        k = max(self.rows[i].params.logprobs or 0 for i in asked)
        top_lp, top_ids = lp.topk(k, dim=-1)
        chosen_h, ids_h, lps_h = chosen.tolist(), top_ids.tolist(), top_lp.tolist()
        for j, i in enumerate(asked):
            n = self.rows[i].params.logprobs or 0
            out[i] = TokenLogprobs(chosen_h[j], ids_h[j][:n], lps_h[j][:n])
        return out

    # Single-model callers read the resolved step directly.
    @property
    def requests(self) -> list[Request]:
        return self.resolve().requests

    @property
    def tokens(self) -> list[int]:
        return self.resolve().tokens

    @property
    def failed(self) -> list[tuple[Request, str]]:
        return self.resolve().failed
