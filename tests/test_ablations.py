"""The ablation switches change how the work is done, never what is produced.

`spin_ms: 0` is not an ablation but takes the same path: every idle engine sleeps
on its eventfd instead of polling while its request is at a peer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trd.bench.engines import run_closed_loop
from trd.supervisor.group import EngineGroup

from routing_cases import jobs, reference, specs

POLICY, PARAMS = "scripted", {"schedule": [0, 0, 1, 0, 1, 1]}


# Without pending KV the prefix cache would hand a returning request its own blocks back:
# the ablation measures freeing them, so it runs without the cache.
# Per commit the switch that changes what engines keep; the slow tier the two that change
# only when they step or sleep.
SWITCHES = [
    pytest.param({"pending_kv": False, "prefix_cache": False}, id="no-kept-kv"),
    pytest.param({"step_sync": True}, id="step-sync", marks=pytest.mark.slow),
    pytest.param({"spin_ms": 0.0}, id="no-spin", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("switch", SWITCHES)
def test_ablations_keep_outputs(tiny_models: dict[str, Path], switch: dict[str, Any]) -> None:
    paths = [tiny_models["small"], tiny_models["large"]]
    work = jobs(paths[0])[2:10]
    expected = reference(paths, POLICY, PARAMS, work)
    group = EngineGroup(specs(paths, POLICY, PARAMS, **switch))
    group.start()
    try:
        results = run_closed_loop(group, work, concurrency=4)
    finally:
        group.close()
    for got, want in zip(results, expected, strict=True):
        assert (got.tokens, got.models) == (want.tokens, want.models)
        fed = {m: d.fed_tokens for m, d in got.dones.items()}
        if switch.get("pending_kv") is False:
            # Every return re-feeds the whole sequence: strictly more work than the
            # suffix-only accounting of the full system.
            assert all(fed[m] > want.fed[m] for m in want.fed), (fed, want.fed)
        else:
            assert fed == want.fed
