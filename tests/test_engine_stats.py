"""Engine counters: exact over any stretch, however long; windows keep the latest only."""

from __future__ import annotations

from trd.engines.stats import WINDOW, EngineStats


def test_counters_outlive_the_windows() -> None:
    stats = EngineStats()
    steps = WINDOW + 10
    for i in range(steps):
        stats.record_step(batch_size=1 + i % 3, seconds=0.5, fed=2)
        stats.record_route(dst=i % 2, committed=int(i % 4 != 0), own=i % 3 == 0)
        stats.record_handoff(1e-6 * i, own=i % 5 == 0)
    snap = stats.snapshot()
    assert snap["steps"] == steps and snap["rows"] == sum(1 + i % 3 for i in range(steps))
    assert snap["busy_s"] == 0.5 * steps
    assert snap["dropped"] == len(range(0, steps, 4))
    assert snap["tokens_committed"] + snap["dropped"] == steps  # a row commits or drops
    assert snap["handoffs_in"] == steps
    # requests with their own routing, counted apart too (the share control leaves them out)
    assert snap["tokens_committed_own"] == sum(i % 4 != 0 for i in range(0, steps, 3))
    assert snap["handoffs_in_own"] == len(range(0, steps, 5))
    window = snap["window"]
    assert len(window["latency"]) == len(window["fed"]) == len(window["handoff_s"]) == WINDOW
    assert window["handoff_s"][-1] == 1e-6 * (steps - 1)  # the latest are kept
