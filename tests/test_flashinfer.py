"""The CUDA path: flashinfer against the torch backend, graphs against eager steps.

Skipped, with the reason, on a host without a CUDA device; on a CUDA host a missing
flashinfer is a failure (install the gpu extra), never a skip. scripts/gpu_check.sh runs
this file (its `suite` stage) and the rest of the GPU checks in one command.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.protocol import SamplingParams
from trd.testing.attention_cases import CASES, HEADS, check_all
from trd.testing.shaped import Shape, write_checkpoint
from trd.testing.tinymodels.tokenizer import VOCAB_SIZE

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device: the flashinfer kernels are GPU-only"
)


def test_flashinfer_is_installed() -> None:
    import flashinfer  # noqa: F401 - a CUDA host without it fails here, loudly


def test_attention_matches_the_float32_torch_backend_in_every_case() -> None:
    rows = check_all("flashinfer", torch.bfloat16, "cuda")
    assert len(rows) == len(CASES) * len(HEADS)
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad


def test_float32_on_cuda_is_refused(tiny_models: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="flashinfer, the CUDA attention backend, runs only"):
        Engine(EngineSpec.of(tiny_models["small"], device="cuda", dtype="float32"))


def test_the_fixtures_head_dim_32_runs_on_the_torch_backend(tiny_models: dict[str, Path]) -> None:
    """flashinfer has no kernels below head_dim 64: `auto` gives such a model torch."""
    spec = EngineSpec.of(tiny_models["small"], device="cuda", dtype="bfloat16", kv_tokens=1024)
    engine = Engine(spec)
    assert engine.runner.attention == "torch" and engine.runner.graphs is None
    assert len(engine.generate([[5, 6, 7]], SamplingParams(max_tokens=4))[0]) == 4


@pytest.fixture(scope="module")
def head64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An 8B-like construction (its head writes token + 1) at head_dim 64."""
    shape = Shape("h64", 256, 512, 2, 4, 2, tied=False, head_dim=64, vocab=4096)
    return write_checkpoint(shape, tmp_path_factory.mktemp("h64"), "cuda")


def test_graphs_give_the_eager_tokens(head64: Path) -> None:
    prompts = [[5 + i for i in range(n)] for n in (3, 17, 40, 2, 6)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    outs = {}
    for graphs in (True, False):
        spec = EngineSpec.of(head64, dtype="bfloat16", device="cuda", kv_tokens=4096,
                             cuda_graphs=graphs)  # fmt: skip
        engine = Engine(spec)
        outs[graphs] = engine.generate(prompts, params)
        if graphs:
            assert engine.runner.graphs is not None and engine.runner.graphs.used.total() > 20
    assert outs[True] == outs[False]
    assert outs[True] == [[(p[-1] + k) % VOCAB_SIZE for k in range(1, 25)] for p in prompts]
