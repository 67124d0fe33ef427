"""The flashinfer backend against the torch backend on CUDA (bf16); skipped without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.protocol import SamplingParams

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (the flashinfer kernels are GPU-only)"
)


def logits_per_step(path: Path, attention: str) -> list[torch.Tensor]:
    spec = EngineSpec.of(path, dtype="bfloat16", device="cuda", attention=attention, kv_tokens=4096)
    engine = Engine(spec)
    prompts = [[5 + i for i in range(n)] for n in (3, 17, 40)]
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=16, ignore_eos=True))
    rows = []
    while engine.has_unfinished():
        result = engine.forward()
        assert result is not None
        rows.append(result.forward.logits.float().cpu())
        for req in result.requests:
            # Teacher-forced, so bf16 rounding cannot steer the two runs apart.
            engine.commit(req, [100 + 7 * len(req.seq) % 900])
    return rows


def test_flashinfer_matches_torch_backend(tiny_models: dict[str, Path]) -> None:
    pytest.importorskip("flashinfer", reason="install the gpu extra: pip install -e '.[gpu]'")
    ours = logits_per_step(tiny_models["large"], "flashinfer")
    ref = logits_per_step(tiny_models["large"], "torch")
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref, strict=True):
        assert (a - b).abs().max().item() <= 2e-2
