"""The daemon's controllers (trd/supervisor/control.py) run without any HTTP app: started
and stopped by their owner, the autotuner skips (and logs why) while the engines have not
reported, and a recommendation that cannot be made is NotReady, not an HTTP error."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from trd.config import from_dict
from trd.supervisor.control import Controllers, NoStatistics, NotReady
from trd.supervisor.deployment import plan_deployment
from trd.supervisor.hub import Hub
from trd.supervisor.keeper import EngineKeeper


def keeper(tiny_models: dict[str, Path], **raw: object) -> EngineKeeper:
    """A keeper of the fixture pair whose engines were never started."""
    models = [{"name": n, "path": str(tiny_models[n])} for n in ("small", "large")]
    cfg = from_dict({"device": "cpu", "models": models, **raw}, Path("/"))
    return EngineKeeper(cfg, plan_deployment(cfg).specs, Hub(cfg.max_inflight), None)


def test_controllers_start_and_stop_with_their_owner(
    tiny_models: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    k = keeper(
        tiny_models,
        policy={"name": "rstitch", "threshold": 0.8, "target_large_share": 0.2},
        batching={"auto_interval_s": 0.05},
    )
    controls = Controllers(k)
    assert controls.share is not None

    async def run() -> None:
        controls.start()
        assert len(controls.tasks) == 3  # rates, autotuner, share
        await asyncio.sleep(0.3)
        assert not any(t.done() for t in controls.tasks)
        tasks = controls.tasks
        await controls.stop()
        assert all(t.cancelled() for t in tasks) and controls.tasks == []

    with caplog.at_level(logging.INFO, logger="trd.control"):
        asyncio.run(run())
    assert "thresholds auto: skipped (not every engine has reported statistics yet)" in caplog.text


def test_only_the_rate_sampler_runs_by_default(tiny_models: dict[str, Path]) -> None:
    controls = Controllers(keeper(tiny_models))

    async def run() -> None:
        controls.start()
        assert len(controls.tasks) == 1 and controls.share is None
        await controls.stop()

    asyncio.run(run())


def test_a_recommendation_without_statistics_is_not_ready(tiny_models: dict[str, Path]) -> None:
    controls = Controllers(keeper(tiny_models))
    with pytest.raises(NoStatistics, match="not every engine") as exc:
        asyncio.run(controls.recommendation())
    assert isinstance(exc.value, NotReady)
