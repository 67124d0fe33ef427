"""Markov throughput model of delayed batching (DESIGN.md sections 5 and 9).

N closed-loop requests move between M models. Model i launches a batch when it
is idle and at least B_i requests wait on it; the batch takes every waiting
request and runs for ceil(L_i(b) / delta) quanta. At completion each request
moves to model j with probability p_ij and commits c_ij tokens.

The embedded chain observes the system right after each event (completions
plus the launches they trigger). A state is the flat integer row

    (k_0, b_0, r_0,  k_1, b_1, r_1,  ...)     k waiting, b running, r quanta left

Running batches age in lock-step, so the next event is min r_i quanta away and
every model reaching 0 then completes together. Throughput follows from the
renewal-reward theorem: E_pi[tokens per event] / E_pi[time per event].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp  # type: ignore[import-untyped]
from scipy.sparse.csgraph import connected_components  # type: ignore[import-untyped]
from scipy.sparse.linalg import spsolve  # type: ignore[import-untyped]

from trd.batching.spec import SystemSpec

Outcome = tuple[tuple[int, ...], float]  # (arrivals per model, probability)

# Power iteration budget and L1 tolerance; far below the 5% the model is good for.
_POWER_STEPS = 10_000
_POWER_TOL = 1e-11


def check_thresholds(m: int, n: int, thresholds: Sequence[int]) -> tuple[int, ...]:
    """Return thresholds as a tuple, or raise ValueError if they can deadlock."""
    b = tuple(int(x) for x in thresholds)
    if len(b) != m:
        raise ValueError(f"need {m} thresholds, got {len(b)}")
    if min(b) < 1:
        raise ValueError(f"thresholds must be >= 1, got {b}")
    if sum(x - 1 for x in b) >= n:
        # Otherwise every model could hold B_i - 1 waiting requests and none launches.
        raise ValueError(f"thresholds {b} violate sum_i(B_i - 1) < N = {n}")
    return b


def _multinomial(row: tuple[tuple[int, float], ...], b: int, m: int) -> list[Outcome]:
    """All ways b requests split over the destinations in row (j, p_ij > 0)."""
    out: list[Outcome] = []

    def split(pos: int, left: int, counts: list[int], prob: float) -> None:
        j, pj = row[pos]
        if pos == len(row) - 1:
            counts[j] = left
            out.append((tuple(counts), prob * pj**left))
            counts[j] = 0
            return
        for a in range(left + 1):
            counts[j] = a
            split(pos + 1, left - a, counts, prob * math.comb(left, a) * pj**a)
        counts[j] = 0

    split(0, b, [0] * m, 1.0)
    return out


class _Chain:
    """Reachable states of the embedded chain and its transition matrix.

    The search is breadth-first over whole levels with numpy: a state is a row
    of the flat layout above, and a mixed-radix int64 key identifies it.
    """

    def __init__(self, spec: SystemSpec, n: int, thresholds: tuple[int, ...]) -> None:
        m = self.m = spec.m
        self.thresholds = np.array(thresholds, dtype=np.int64)
        quanta = spec.quanta()[:, :n]
        # launch_quanta[i, b]: step time of a b-request batch; column 0 pads k = 0.
        self.launch_quanta = np.concatenate([np.zeros((m, 1), dtype=np.int64), quanta], axis=1)
        self.rows = [
            tuple((j, float(x)) for j, x in enumerate(spec.p[i]) if x > 0) for i in range(m)
        ]
        self.gain = (spec.p * spec.c).sum(axis=1)
        radix = [r for i in range(m) for r in (n + 1, n + 1, int(quanta[i].max()) + 1)]
        if math.prod(radix) >= 2**63:
            raise ValueError(
                "state space too large to index: use a coarser delta_ms or fewer requests"
            )
        self.weights = np.cumprod([1, *radix[:-1]], dtype=np.int64)
        self._arrival_cache: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        k0 = np.zeros((1, m), dtype=np.int64)
        k0[0, 0] = n
        empty = np.zeros((1, m), dtype=np.int64)
        self._explore(self._launch(k0, empty, empty))

    def _launch(self, k: np.ndarray, b: np.ndarray, r: np.ndarray) -> np.ndarray:
        """States (rows) after idle models with k_i >= B_i launch all k_i requests."""
        go = (b == 0) & (k >= self.thresholds)
        step = self.launch_quanta[np.arange(self.m), k]
        state = np.stack([np.where(go, 0, k), np.where(go, k, b), np.where(go, step, r)], axis=2)
        return state.reshape(len(k), 3 * self.m)

    def _arrivals(self, done_b: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Joint arrivals (outcomes x M) and their probabilities when the models with
        done_b[i] > 0 complete batches of that size: a product of multinomials."""
        if done_b not in self._arrival_cache:
            outcomes: dict[tuple[int, ...], float] = {(0,) * self.m: 1.0}
            for i, b in enumerate(done_b):
                if b == 0:
                    continue
                merged: dict[tuple[int, ...], float] = {}
                for a, pa in outcomes.items():
                    for x, px in _multinomial(self.rows[i], b, self.m):
                        key = tuple(u + v for u, v in zip(a, x, strict=True))
                        merged[key] = merged.get(key, 0.0) + pa * px
                outcomes = merged
            self._arrival_cache[done_b] = (
                np.array(list(outcomes), dtype=np.int64),
                np.array(list(outcomes.values())),
            )
        return self._arrival_cache[done_b]

    def _step(self, states: np.ndarray) -> tuple[np.ndarray, ...]:
        """For each state: quanta to the next event, expected tokens at it, and the
        successors as (row in states, successor state, probability) triples."""
        k, b, r = states[:, 0::3], states[:, 1::3], states[:, 2::3]
        running = b > 0
        dt = np.where(running, r, np.iinfo(np.int64).max).min(axis=1)
        r = np.where(running, r - dt[:, None], 0)
        done = running & (r == 0)
        done_b = np.where(done, b, 0)
        tokens = (done_b * self.gain).sum(axis=1)
        b = np.where(done, 0, b)
        signatures, group = np.unique(done_b, axis=0, return_inverse=True)
        src, succ, prob = [], [], []
        for g, signature in enumerate(signatures):
            rows = np.flatnonzero(group.reshape(-1) == g)
            arrivals, probs = self._arrivals(tuple(signature.tolist()))
            per = len(probs)
            kk = (k[rows][:, None, :] + arrivals[None, :, :]).reshape(-1, self.m)
            succ.append(self._launch(kk, np.repeat(b[rows], per, 0), np.repeat(r[rows], per, 0)))
            src.append(np.repeat(rows, per))
            prob.append(np.tile(probs, len(rows)))
        return dt, tokens, np.concatenate(src), np.concatenate(succ), np.concatenate(prob)

    def _explore(self, initial: np.ndarray) -> None:
        index = {int(initial[0] @ self.weights): 0}
        frontier, size = initial, 1
        src, dst, prob, hold, reward = [], [], [], [], []
        while len(frontier):
            first = size - len(frontier)  # frontier rows are states first, first + 1, ...
            dt, tokens, rows, succ, p = self._step(frontier)
            hold.append(dt)
            reward.append(tokens)
            keys, pick, where = np.unique(
                succ @ self.weights, return_index=True, return_inverse=True
            )
            ids = np.array([index.get(x, -1) for x in keys.tolist()], dtype=np.int64)
            new = ids < 0
            ids[new] = np.arange(size, size + new.sum())
            index.update(zip(keys[new].tolist(), ids[new].tolist(), strict=True))
            size += int(new.sum())
            src.append(rows + first)
            dst.append(ids[where.reshape(-1)])
            prob.append(p)
            frontier = succ[pick[new]]
        self.matrix = sp.csr_matrix(
            (np.concatenate(prob), (np.concatenate(src), np.concatenate(dst))), shape=(size, size)
        )
        self.hold = np.concatenate(hold).astype(np.float64)
        self.reward = np.concatenate(reward)


def _stationary(matrix: sp.csr_matrix) -> np.ndarray:
    """Stationary distribution of an irreducible chain: pi P = pi, sum pi = 1."""
    size = matrix.shape[0]
    step = matrix.T.tocsr()
    pi = np.full(size, 1.0 / size)
    for _ in range(_POWER_STEPS):
        # The lazy chain (I + P) / 2 has the same stationary law and is aperiodic, so
        # this converges even when deterministic step times lock the chain in cycles.
        new = 0.5 * (pi + step @ pi)
        if np.abs(new - pi).sum() < _POWER_TOL:
            return new / new.sum()
        pi = new
    # Nearly decomposable chains mix too slowly for the iteration: solve directly.
    # Pin pi_0 = 1 and drop its balance equation (they have rank size - 1).
    a = (step - sp.identity(size, format="csr")).tocsc()
    rest = spsolve(a[1:, 1:], -a[1:, 0].toarray().ravel(), permc_spec="MMD_AT_PLUS_A")
    pi = np.concatenate(([1.0], np.atleast_1d(rest)))
    return pi / pi.sum()


def _absorption(chain: _Chain, labels: np.ndarray, closed: list[int]) -> np.ndarray:
    """Probability that the chain started in state 0 ends in each closed class."""
    start = labels[0]
    if start in closed:
        return np.array([float(c == start) for c in closed])
    transient = np.flatnonzero(~np.isin(labels, closed))
    p_tt = chain.matrix[transient][:, transient]
    to_class = np.stack(
        [np.asarray(chain.matrix[transient][:, labels == c].sum(axis=1)).ravel() for c in closed],
        axis=1,
    )
    a = sp.identity(len(transient), format="csc") - p_tt.tocsc()
    h = np.asarray(spsolve(a, to_class)).reshape(len(transient), len(closed))
    return h[np.searchsorted(transient, 0)]


def throughput(spec: SystemSpec, n: int, thresholds: Sequence[int]) -> float:
    """Steady-state committed tokens per second with n requests and thresholds B.

    States visited only at start-up are transient and get no weight. If the
    routing can trap requests in several closed classes (e.g. two absorbing
    models), the result is the expected long-run throughput over where the
    system ends up from the start state (all n requests waiting at model 0).
    """
    if not 1 <= n <= spec.max_n:
        raise ValueError(f"n must be in 1..{spec.max_n} (the step_ms table length), got {n}")
    chain = _Chain(spec, n, check_thresholds(spec.m, n, thresholds))
    _, labels = connected_components(chain.matrix, directed=True, connection="strong")
    # A strongly connected class is closed (recurrent) if no transition leaves it.
    coo = chain.matrix.tocoo()
    leaking = set(labels[coo.row[labels[coo.row] != labels[coo.col]]].tolist())
    closed = sorted(set(labels.tolist()) - leaking)
    weights = _absorption(chain, labels, closed)
    total = 0.0
    for c, w in zip(closed, weights, strict=True):
        members = np.flatnonzero(labels == c)
        pi = _stationary(chain.matrix[members][:, members])
        per_quantum = pi @ chain.reward[members] / (pi @ chain.hold[members])
        total += w * per_quantum
    return float(total / spec.delta_ms * 1000.0)
