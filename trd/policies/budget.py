"""A request's own routing threshold: given (`routing.threshold`), or set within the
request to hold its share of large-model tokens (`routing.large_share`). Pure Python.

A threshold policy escalates a position when its score is on the large model's side of
tau (trd/policies/params.py: THRESHOLDS, `raises_share` says which side). With
`large_share` s the request carries its own tau, set by the entry model before each of
its decisions from what this request has seen so far:

    S        the entry model's scores at its earlier decisions in this request, sorted
             (oriented so that a higher score means less certain)
    N, L     output tokens committed so far, and how many of them the last model wrote
    deficit  D = s (N + 1) - L          large tokens owed, were this position small's
    p        = clamp(s + D / GAIN_TOKENS, 0, 1)
    tau      = S[ceil((1 - p) n) - 1]    (n = |S|; +inf when n = 0 or p = 0, -inf at p = 1)

so a position escalates when its score exceeds at least ceil((1 - p) n) of the n
earlier ones: the least certain fraction p of the request's positions, by the request's
own distribution of scores (no scale to tune per policy, pair or prompt). p starts at s
(one large token per escalation, as CITER, R2R and Co-LLM make, lands on s) and moves
by 1/GAIN_TOKENS per token of deficit, an integral action on the share's error: where an
escalation brings several large tokens (R-Stitch keeps the large model while it is
unsure; GlimpRouter gives it a step), the request runs ahead of its budget until p has
fallen to what holds s. R-Stitch's large model stays only while the budget allows one
more large token after the one it commits (`may_stay`: L + 2 <= s (N + 2)), so a run
never overshoots by more than that token.

Everything is a function of the request's own history, so it is reproducible: the
reference loop runs the same policy code on the same request state. The entry model's
tau and L travel with each handoff (PeerReq.tau, PeerReq.large); S stays on the entry
model, the only one that adds to it.
"""

from __future__ import annotations

import bisect
import math

GAIN_TOKENS = 4.0  # tokens of deficit that move the escalated fraction p by 1


def share_tau(scores: list[float], share: float, made: int, large: int) -> float:
    """The oriented threshold of the entry model's next decision (module docstring)."""
    deficit = share * (made + 1) - large
    p = share + deficit / GAIN_TOKENS
    n = len(scores)
    if n == 0 or p <= 0:
        return math.inf
    if p >= 1:
        return -math.inf
    return scores[math.ceil((1 - p) * n) - 1]


def may_stay(share: float, made: int, large: int) -> bool:
    """Whether the last model, committing a token now (made and large before it), may
    write the next one too and stay within the share."""
    return large + 2 <= share * (made + 2)


def remember(scores: list[float], score: float) -> None:
    """Add one decision's oriented score to the sorted `scores`."""
    bisect.insort(scores, score)
