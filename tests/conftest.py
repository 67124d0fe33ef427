"""Shared fixtures: the tiny fixture models, built once into the repo's .cache/ folder.

Two tiers. `pytest` (the README's command, what CI runs on every commit) runs everything
but the tests marked `slow`, in two pytest-xdist workers (`--dist loadfile`: a module's
daemon starts once); `pytest -m slow -n 0` runs those, serially: each is a longer run of a
behaviour the per-commit tier also checks, more cheaply:

    slow tier                                    per-commit guard
    demo pair: the 0.5B vs transformers in       test_demo_parts (join, verify), the
      float64, the --demo daemon vs the loop,    real SmolLM2 vs transformers, the shaped
      every policy at N=4 in float32             Qwen2 checkpoints, every policy on the
                                                 fixtures vs the loop (routing_processes)
    share control holds the share 30 s           the first move in force, kept over an
                                                 engine restart; the lagged-plant loop
    schema fuzz, 600 bodies                      the same fuzz, 50 bodies
    guidellm's runs                              guidellm installed; the openai SDK's counts
    the simulation grid                          its corner cases
    routing at 4 in flight (processes,           the same at 1 and 16
      grammars); seven of the eight process      for one of them; every policy
      cases at 1 and 16                          in-process (test_routing_inprocess)
    prefill ahead, six of the seven in-process   the three-model scripted case's
      cases
    share_run.py's 20 s run                      the share control's first move
    the step_sync and spin_ms ablations          the kept-KV ablation
    the GPU check's dry run                      its stages' parts
    the GPU check's --bench mode                 its start without a device; the gpu
                                                 plan's dry run (test_gpu_bench)
    llama.cpp's tokenizer, live                  its recorded ids
    bench compare's smoke run (~170 s)           the plans' jobs, the step costs
                                                 (test_bench_workloads), the one client
                                                 (test_bench_serve)
    the baseline plan's smoke run (~120 s)       one of its systems measured at N=1
    a request's share on nine prompts            the same on one prompt per share

Hypothesis draws the same examples on every run (the derandomized profile below).

The demo pair (tests marked `demo_pair`: Qwen2.5-Coder 0.5B + 1.5B, joined from the
`demo` extra's GGUF parts and imported in bfloat16, and in the int8 that `--demo` serves)
takes a few minutes to import on a fresh checkout, so a run that collects such tests
starts importing it at once in a niced background process and runs those tests last:
the import uses the core the other tests leave idle, and `ensure_demo_pair` in their
fixtures waits on each model's lock until it is done (or imports in the foreground, with
its real error, if the background one failed).
Commands that tests only read the result of (mypy, the GPU check's dry run, the
benchmark scripts' short runs) start early the same way: tests/background.py.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from hypothesis import settings

from trd.testing.tinymodels.build import ensure_models

import background
from routing_cases import random_heads

if TYPE_CHECKING:
    from trd.frontend.tokens import PromptEncoder

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO_ROOT / ".cache"
# save_random_checkpoint takes its tokenizer from the default cache; point that
# at the same folder so a test run never writes to the home directory.
os.environ.setdefault("TRD_CACHE_DIR", str(CACHE_DIR))
# One thread in the test process: next to the engine processes under test, OpenMP
# threads spin against them on a 2-core machine and everything runs many times slower.
torch.set_num_threads(1)
# The openai client logs every request at INFO: a failing load test's report held
# thousands of such lines, and CI keeps only the log's tail, so the failure was not in it.
logging.getLogger("httpx2").setLevel(logging.WARNING)
# Hypothesis draws the same examples on every run: a fresh clone has no example database,
# so a failure found at random would not replay. HYPOTHESIS_PROFILE=explore draws anew.
settings.register_profile("derandomized", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "derandomized"))
_build: subprocess.Popen[bytes] | None = None


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: only what will run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Start the collected tests' background commands and run their tests late (the runs
    have the longest time to finish); run the demo-pair tests last, and start building
    their pair now. Under pytest-xdist the commands start when their tests ask
    (tests/background.py), so those tests go first instead: the longest units of work
    first, and no worker left alone with mypy at the end."""
    global _build
    late = [item for item in items if item.get_closest_marker("background")]
    demo = [item for item in items if item.get_closest_marker("demo_pair")]
    rest = [item for item in items if item not in late and item not in demo]
    items[:] = (late + rest if background.lazy() else rest + late) + demo
    if config.option.collectonly:
        return
    background.start_collected(late)
    if not demo:
        return
    # SIGTERM (pytest_sessionfinish) exits through the build's cleanup: killed outright,
    # it left its temp folder with a 721 MB partial GGUF in the cache.
    code = (
        "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(143)); "
        f"import trd.demo.pair as p; p.ensure_demo_pair('qwen', {str(CACHE_DIR)!r}); "
        f"p.ensure_demo_pair('qwen', {str(CACHE_DIR)!r}, p.DEMO_QUANTIZATION['qwen'])"
    )
    CACHE_DIR.mkdir(exist_ok=True)
    with (CACHE_DIR / "demo-pair-build.log").open("wb") as log:
        _build = subprocess.Popen(
            [sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT,
            cwd=REPO_ROOT, preexec_fn=lambda: os.nice(background.NICENESS),
        )  # fmt: skip


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An interrupted or partial run leaves no build behind (the cache keeps no half)."""
    if _build is not None and _build.poll() is None:
        _build.terminate()
        _build.wait()
    background.stop_all()


@pytest.fixture
def finished(request: pytest.FixtureRequest) -> background.Finished:
    """The test's background command (`@pytest.mark.background`), run to its end."""
    return background.finished(request.node)


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    """{"small", "mid", "large"}: trained Qwen3 checkpoint folders sharing one tokenizer."""
    models = ensure_models(CACHE_DIR)
    background.start_after_models()
    return models


@pytest.fixture(scope="session")
def encoder(tiny_models: dict[str, Path]) -> PromptEncoder:
    """The front end's tokenizer over the fixtures' (a test module may define its own)."""
    from trd.frontend.tokens import PromptEncoder  # transformers: only for tests that ask

    return PromptEncoder(tiny_models["small"])


@pytest.fixture(scope="session")
def tokenizer_path(tiny_models: dict[str, Path]) -> Path:
    """A folder AutoTokenizer.from_pretrained loads the shared fixture tokenizer from."""
    return tiny_models["small"]


@pytest.fixture(scope="session")
def heads(
    tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]
) -> dict[str, Path]:
    """{"citer", "r2r", "collm"}: seeded, untrained router heads for the fixtures' pair."""
    return random_heads(tmp_path_factory.mktemp("heads"), tiny_models["small"])
