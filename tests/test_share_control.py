"""The large-model share held at a target: the control law alone, then the real daemon.

The daemon tests run the fixture pair under R-Stitch started far from the threshold that
gives the target and send a mixed workload (prompt lengths, output lengths, greedy and
sampled) over HTTP. Per commit: the first move of the threshold goes the right way and
is in force on the engines, and an engine killed then restarts with the moved threshold
and with the batching thresholds set live (trd/supervisor/keeper.py's promise). Slow tier:
the share comes within 3 points of the target and stays there (`trctl status`, from the
engines' own token counters), about two minutes.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from trd.cli import format_status, request
from trd.policies.params import (
    THRESHOLDS,
    PolicyError,
    PolicySpec,
    parse_policy,
    request_share,
    target_share,
)
from trd.supervisor.share import ShareControl
from trd.testing.tinymodels.corpus import corpus

from daemon_fixture import Daemon, start_daemon, write_config
from engine_status import fresh_engines

TARGET = 0.3


def plant(tau: float, raises: bool) -> float:
    """A steep share(threshold) curve, like R-Stitch's on the fixtures."""
    x = (tau - 0.6) * 25
    return 1 / (1 + math.exp(x if not raises else -x))


class Plant:
    """Tokens as a serving engine commits them: CHAINS requests, each a two-state chain
    whose large runs last `run` tokens on average, at the share plant(tau) in force. A
    threshold set reaches the engine `lag` ticks later, as the daemon's Stats arrive up to
    half a tick late (the entry engine reports the threshold it decides with)."""

    CHAINS = 8

    def __init__(self, run: float, seed: int, lag: int = 0) -> None:
        self.run, self.rng = run, random.Random(seed)
        self.in_large = [False] * self.CHAINS
        self.large = self.total = self.visits = 0
        self.taus = [0.95] * (lag + 1)

    def tick(self, n: int, tau: float | None, raises: bool) -> None:
        """`n` tokens at the threshold set `lag` ticks ago, after the loop set `tau`."""
        self.commit(n, plant(self.taus[0], raises))
        self.taus = [*self.taus[1:], self.taus[-1] if tau is None else tau]

    def commit(self, n: int, share: float) -> None:
        leave = 1 / self.run
        enter = min(1.0, leave * share / (1 - share))
        for i in range(n):
            c = i % self.CHAINS
            was = self.in_large[c]
            now = self.rng.random() >= leave if was else self.rng.random() < enter
            self.visits += now and not was
            self.in_large[c] = now
            self.large += now
            self.total += 1

    def stats(self) -> list[dict[str, Any]]:
        return [{"tokens_committed": self.total - self.large, "policy_threshold": self.taus[0]},
                {"tokens_committed": self.large, "handoffs_in": self.visits}]  # fmt: skip


@pytest.mark.parametrize(("per_tick", "lag"), [(300, 0), (1500, 1), (1500, 2)])
@pytest.mark.parametrize("run", [1.0, 6.0])
@pytest.mark.parametrize("name", ["rstitch", "citer"])
def test_the_loop_converges_and_holds_on_a_noisy_plant(
    name: str, run: float, per_tick: int, lag: int
) -> None:
    """citer's threshold raises the share, R-Stitch's lowers it: the loop knows which; with
    large runs of 6 tokens (a window's share 2-3x noisier) it holds near it. With a tick's
    worth of tokens past MIN_TOKENS and a threshold in force ticks after it was set (the
    daemon's case), a window begun at the move swung the threshold in a limit cycle."""
    scale = THRESHOLDS[name]
    ctl = ShareControl(TARGET, scale)
    tokens = Plant(run, seed=1, lag=lag)
    taus, shares = [], []
    for tick in range(200):
        shares.append(plant(tokens.taus[0], scale.raises_share))
        tau = ctl.observe(float(tick), tokens.stats())
        assert ctl.tau is not None and scale.low <= ctl.tau <= scale.high
        taus.append(ctl.tau)
        tokens.tick(per_tick, tau, scale.raises_share)
    errors = [abs(s - TARGET) for s in shares[100:]]
    if run == 1.0:
        assert max(errors) <= 0.03, shares[100:]
    else:
        # A window's noise with runs of 6 is about 0.03 even at MAX_WINDOW_TOKENS, so the
        # share wanders that much around the target (calibrated on 40 seeds: mean error at
        # most 0.032, worst tick 0.12); a limit cycle swings it by 0.7
        assert sum(errors) / len(errors) <= 0.04 and max(errors) <= 0.15, shares[100:]
    steps = [abs(a - b) for a, b in itertools.pairwise(taus)]
    assert max(steps) <= 0.1 + 1e-12  # bounded moves
    assert ctl.moves < 30  # near the target, sampling noise alone seldom moves it


def test_requests_with_their_own_routing_are_left_out_of_the_measurement() -> None:
    """The daemon-routed tokens on the target, requests with their own routing (pinned to
    the large model, say) beside them: the threshold stays. Counted in, they would
    have the share at 65% and the loop lowering every other request's share."""
    ctl = ShareControl(TARGET, THRESHOLDS["rstitch"])

    def stats(t: int) -> list[dict[str, Any]]:
        small = {"tokens_committed": 700 * t, "policy_threshold": 0.5}
        large = {"tokens_committed": 1300 * t, "tokens_committed_own": 1000 * t,
                 "handoffs_in": 60 * t, "handoffs_in_own": 10 * t}  # fmt: skip
        return [small, large]

    assert [ctl.observe(float(t), stats(t)) for t in range(1, 40)] == [None] * 39
    assert ctl.view()["measured"] == pytest.approx(TARGET)


def test_target_share_is_checked_with_the_policy() -> None:
    parse_policy("rstitch", {"threshold": 0.8, "target_large_share": 0.2}, num_models=2)
    with pytest.raises(PolicyError, match=r"policy.target_large_share: 1.2: expected a number"):
        parse_policy("rstitch", {"target_large_share": 1.2}, num_models=2)
    with pytest.raises(PolicyError, match=r"policy.target_large_share: .*unknown parameter"):
        parse_policy("scripted", {"schedule": [0, 1], "target_large_share": 0.2}, num_models=2)


def test_request_share_is_checked_with_the_policy() -> None:
    spec = PolicySpec("citer", {"head": "h", "request_large_share": 0.3})
    assert (request_share(spec), target_share(spec)) == (0.3, None)
    parse_policy("rstitch", {"threshold": 0.1, "request_large_share": 0.3}, num_models=2)
    for bad in (0, 1, True, "0.3"):
        with pytest.raises(PolicyError, match=r"policy.request_large_share: .*strictly between"):
            parse_policy("rstitch", {"request_large_share": bad}, num_models=2)
    with pytest.raises(PolicyError, match=r"policy.request_large_share: .*unknown parameter"):
        parse_policy("ensemble", {"request_large_share": 0.2}, num_models=2)
    both = {"target_large_share": 0.2, "request_large_share": 0.3}
    with pytest.raises(PolicyError, match=r"request_large_share: 0.3: give it or target_large"):
        parse_policy("rstitch", both, num_models=2)


def workload(rng: random.Random, docs: list[str]) -> dict[str, Any]:
    doc = rng.choice(docs)
    start = rng.randrange(max(1, len(doc) - 400))
    body: dict[str, Any] = {
        "prompt": doc[start : start + rng.choice((40, 120, 300))],
        "max_tokens": rng.choice((16, 32, 64)),
    }
    if rng.random() < 0.3:
        body |= {"temperature": 0.8, "seed": rng.randrange(1 << 30)}
    return body


HOLD_S = 30
# Consecutive 1 s samples in the band before the hold starts: the first crossing can be
# the controller passing through the target on an overshoot (a fresh-clone CI run held
# from such a crossing while the threshold still moved 0.94 -> 0.84: 34.3% over the hold)
SETTLE_SAMPLES = 3


class Traffic:
    """`clients` threads sending the mixed workload until stopped; their errors kept."""

    def __init__(self, daemon: Daemon, clients: int) -> None:
        self.daemon, self.stop, self.errors = daemon, threading.Event(), list[str]()
        self.docs = corpus("heldout")  # built once, before the clock starts (many files)
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True)
                        for i in range(clients)]  # fmt: skip
        for t in self.threads:
            t.start()

    def client(self, seed: int) -> None:
        rng, api = random.Random(seed), self.daemon.client()
        while not self.stop.is_set():
            try:
                api.completions.create(model=self.daemon.model, **workload(rng, self.docs))
            except Exception as exc:  # reported by the test
                self.errors.append(repr(exc))

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)


# tau 0.3 sends almost every token to the large model; the target needs about 0.85
POLICY = {"name": "rstitch", "threshold": 0.3, "target_large_share": TARGET}


def test_a_restarted_engine_decides_with_the_thresholds_in_force(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    restart = {"max_retries": 1, "backoff_s": 0.2}
    daemon = start_daemon(write_config(tmp_path, tiny_models, ["small", "large"], policy=POLICY,
                                       restart=restart))  # fmt: skip
    try:
        traffic = Traffic(daemon, 4)
        try:  # until the first move is in force on both engines
            engines = fresh_engines(daemon, time.time(), moved, timeout=120)
        finally:
            traffic.close()
        assert not traffic.errors, traffic.errors[:3]
        tau = daemon.status()["share"]["threshold"]
        assert 0.3 < tau == engines[0]["policy_threshold"]  # up: fewer tokens to the large
        live = {"thresholds": {"large": [1, 2]}, "max_wait_ms": 7.0}
        request(daemon.admin, "POST", "/thresholds", live)
        large = engines[1]["pid"]
        os.kill(large, signal.SIGKILL)
        killed = time.time()
        deadline = time.monotonic() + 90
        while daemon.status()["restarts"] == 0:
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.2)
        daemon.wait_ready(timeout=90)
        engines = fresh_engines(daemon, killed)
        assert engines[1]["pid"] != large
        assert [e["policy_threshold"] for e in engines] == [tau, tau]
        assert (engines[1]["thresholds"], engines[1]["max_wait_ms"]) == ([1, 2], 7.0)
    finally:
        daemon.stop()


def moved(engines: list[dict[str, Any]]) -> bool:
    """The share control's first move is in force: both engines decide with a new tau."""
    return all(e["policy_threshold"] != POLICY["threshold"] for e in engines)


@pytest.mark.slow
def test_the_daemon_holds_the_large_share(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    daemon = start_daemon(write_config(tmp_path, tiny_models, ["small", "large"], policy=POLICY))
    traffic = Traffic(daemon, 6)
    try:
        reached = None
        in_band = 0
        samples: list[tuple[float, int, int, dict]] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(1.0)
            status = daemon.status()
            counts = [e["tokens_committed"] or 0 for e in status["engines"]]
            samples.append((time.monotonic(), counts[-1], sum(counts), status))
            measured = status["share"]["measured"]
            near = measured is not None and abs(measured - TARGET) <= 0.03
            in_band = in_band + 1 if near else 0
            if reached is None and in_band >= SETTLE_SAMPLES:
                reached = time.monotonic()
                deadline = reached + HOLD_S + 5  # a band reached late still gets its hold
            # 30 s of hold: over a shorter stretch one sampled response can move the
            # share by a few points (15 s failed once by 0.001 past the bound)
            if reached is not None and time.monotonic() - reached >= HOLD_S:
                break
        assert reached is not None, [s[3]["share"] for s in samples]
        held = [s for s in samples if s[0] >= reached]
        (_, l0, t0, _), (_, l1, t1, last) = held[0], held[-1]
        assert t1 - t0 > 1000  # a real stretch of work
        assert abs((l1 - l0) / (t1 - t0) - TARGET) <= 0.03, [s[3]["share"] for s in held]
        share = last["share"]
        assert share["moves"] > 0 and 0.5 < share["threshold"] <= 1.0
        line = next(x for x in format_status(last).splitlines() if x.startswith("large-model"))
        assert line.startswith(f"large-model share: target {TARGET:.1%}, measured ")
    finally:
        traffic.close()
        daemon.stop()
    assert not traffic.errors, traffic.errors[:3]
