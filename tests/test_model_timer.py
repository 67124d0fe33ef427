"""The model timer keeps a bounded number of CUDA events when nothing reads it (serving),
and still sums every step. Without a GPU, stand-in events with a device clock that lags
the host by a set number of steps (a double of CUDA's events, not of our code)."""

from __future__ import annotations

import pytest
import torch

from trd.engines.runner import ModelTimer


class Device:
    """Steps the device has finished, and a log of host waits."""

    def __init__(self, lag: int) -> None:
        self.recorded, self.lag, self.waits = 0, lag, 0

    def done(self, t: int) -> bool:
        return t <= self.recorded - self.lag


def fake_events(monkeypatch: pytest.MonkeyPatch, dev: Device) -> None:
    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.t = -1

        def record(self) -> None:
            dev.recorded += 1
            self.t = dev.recorded

        def query(self) -> bool:
            return dev.done(self.t)

        def synchronize(self) -> None:
            dev.waits += 1
            dev.lag = max(dev.recorded - self.t, 0)  # the device catches up to this event

        def elapsed_time(self, end: Event) -> float:
            assert dev.done(end.t), "read before the device finished the step"
            return 1.0  # ms per step

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: setattr(dev, "lag", 0))


@pytest.mark.parametrize(("lag", "waits"), [(4, 0), (10_000, 1)])
def test_events_stay_bounded_and_every_step_is_counted(
    monkeypatch: pytest.MonkeyPatch, lag: int, waits: int
) -> None:
    dev = Device(lag)
    fake_events(monkeypatch, dev)
    timer = ModelTimer(torch.device("cuda"))
    for _ in range(5000):
        timer.start()
        timer.stop()
        assert len(timer._events) <= ModelTimer.MAX_PENDING
    # A device far behind: the host waits once, for the oldest step; then folds as it goes.
    assert dev.waits == waits
    assert timer.seconds == pytest.approx(5.0)  # 5000 steps of 1 ms
    assert not timer._events
