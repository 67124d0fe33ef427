"""Memory under minutes of mixed load (slow tier): an engine that keeps something per
request shows it as resident bytes per request served.

The daemon on the fixtures (two engines handing every response back and forth) takes
`bench serve --duration` with the soak mix (both endpoints, cut streams, bad fields,
grammars, shared and unshared prefixes) for five minutes, its memory sampled every ten
seconds. After a 90-second warm-up, each engine's anonymous resident bytes against the
requests served must have a least-squares slope under 8 KB a request. The mutation it
is meant to catch, an engine that keeps each finished request (a dict of them in the
scheduler), grew 16 and 20 KB a request in a 2-minute smoke (30 s warm-up, shared
2-core machine); the same smoke without it still grew 14 and 12 KB a request, so two
minutes are warm-up on the fixtures and this test's five have yet to be shown to
separate the two on a quiet machine. The per-commit guard of the same behaviour, that
nothing stays behind once a load ends, is in tests/test_e2e_structured.py.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon_fixture import Daemon, start_daemon, write_config

pytestmark = pytest.mark.slow
LIMIT_B_PER_REQUEST = 8 << 10
WARMUP_S = 90


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]
) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("e2e_memory")
    d = start_daemon(write_config(tmp, tiny_models, ["small", "large"], max_model_len=1024))
    yield d
    assert d.stop() == 0, d.log()


def test_engines_stay_flat_under_minutes_of_mixed_load(daemon: Daemon, tmp_path: Path) -> None:
    from trd.bench.serve import main as bench_serve

    out = tmp_path / "soak.json"
    argv = ["--base-url", daemon.url, "--admin", daemon.admin, "--duration", "5m",
            "--warmup", f"{WARMUP_S}s", "--sample-every", "10s", "--out", str(out)]  # fmt: skip
    bench_serve(argv)
    run = json.loads(out.read_text())["runs"][0]
    assert run["summary"]["outcomes"]["error"] == 0, run["summary"]["first_error"]
    assert run["left_behind"] == {}
    after = [s for s in run["samples"] if s["t_s"] >= WARMUP_S]
    served = [s["requests_done"] for s in after]
    assert served[-1] - served[0] >= 200, "too few requests after the warm-up to judge"
    for name in ("small", "large"):
        anon = [s["processes"][name]["anon_bytes"] for s in after]
        slope = statistics.linear_regression(served, anon).slope
        assert slope < LIMIT_B_PER_REQUEST, (name, f"{slope:.0f} B/request", anon)
