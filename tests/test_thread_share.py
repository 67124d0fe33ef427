"""ThreadShare: an engine runs a forward on the host's cores only while its peers there
are idle, says so for the forward's length, and never widens on a peer's running."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from trd.engines.threads import ThreadShare
from trd.ipc.counters import Counters


@pytest.fixture
def counters() -> Iterator[Counters]:
    c = Counters.create(f"trd-test-threads-{time.monotonic_ns()}", 3)
    yield c
    c.close()


def test_an_engine_widens_only_while_its_host_peers_are_idle(counters: Counters) -> None:
    a = ThreadShare(0, 1, 2, peers=(1,), counters=counters)
    b = ThreadShare(1, 1, 2, peers=(0,), counters=counters)
    counters.set_active(1)
    assert a.begin(1) == 2  # the one request is a's, b is idle: its core is free
    assert counters.wide(0) and b.peer_wide()
    counters.set_busy(1, 1)
    assert b.begin(1) == 1  # a runs wide: b keeps to its share
    a.end()
    assert not counters.wide(0) and not b.peer_wide()
    assert a.begin(1) == 1  # b now has a runnable request
    a.end()
    counters.set_busy(1, 0)
    assert (a.begin(1), a.wide_forwards, b.wide_forwards) == (2, 2, 0)


def test_no_engine_widens_while_a_request_may_reach_a_peer(counters: Counters) -> None:
    """Three requests in the daemon, two runnable here: the third is elsewhere (at the
    front end, or pending at a peer that is idle for a moment) and may start there."""
    a = ThreadShare(0, 1, 2, peers=(1,), counters=counters)
    counters.set_active(3)
    assert a.begin(2) == 1
    assert a.begin(3) == 2


def test_engines_on_other_hosts_do_not_count(counters: Counters) -> None:
    """Engine 2 runs elsewhere (its slots are mirrored): its work uses other cores."""
    a = ThreadShare(0, 1, 2, peers=(1,), counters=counters)
    counters.set_busy(2, 5)
    counters.set_wide(2, True)
    assert a.begin(1) == 2 and not a.peer_wide()


@pytest.mark.parametrize(("threads", "alone"), [(2, 2), (2, 1), (3, 0)])
def test_no_wider_setting_never_widens(counters: Counters, threads: int, alone: int) -> None:
    share = ThreadShare(0, threads, alone, peers=(1,), counters=counters)
    assert share.begin(1) == threads
    share.end()
    assert (share.wide_forwards, counters.wide(0)) == (0, False)


def test_without_counters_an_engine_keeps_its_threads() -> None:
    share = ThreadShare(0, 1, 4, peers=(), counters=None)
    assert (share.begin(1), share.peer_wide()) == (1, False)


def test_wide_flags_are_not_mirrored_to_other_hosts(counters: Counters) -> None:
    counters.set_wide(1, True)
    assert counters.num_slots == 1 + 2 * 3
    assert 1 not in counters.read(list(range(counters.num_slots))).values()
