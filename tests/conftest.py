"""Shared fixtures: the tiny fixture models, built once into the repo's .cache/ folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from trd.tinymodels.build import ensure_models

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO_ROOT / ".cache"
# save_random_checkpoint takes its tokenizer from the default cache; point that
# at the same folder so a test run never writes to the home directory.
os.environ.setdefault("TRD_CACHE_DIR", str(CACHE_DIR))
# One thread in the test process: next to the engine processes under test, OpenMP
# threads spin against them on a 2-core machine and everything runs many times slower.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    """{"small", "mid", "large"}: trained Qwen3 checkpoint folders sharing one tokenizer."""
    return ensure_models(CACHE_DIR)


@pytest.fixture(scope="session")
def tokenizer_path(tiny_models: dict[str, Path]) -> Path:
    """A folder AutoTokenizer.from_pretrained loads the shared fixture tokenizer from."""
    return tiny_models["small"]
