"""Picking the attention backend: flashinfer is imported only when used, and a missing
flashinfer either falls back (auto, with a warning) or fails naming the setting."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

from trd.engines.attention import make_backend, resolve_backend
from trd.models.checkpoint import ModelConfig

CUDA, CPU = torch.device("cuda"), torch.device("cpu")
CFG = ModelConfig.from_dict(
    {"model_type": "qwen3", "num_hidden_layers": 1, "num_attention_heads": 2,
     "num_key_value_heads": 1, "hidden_size": 64, "intermediate_size": 8, "vocab_size": 8},
    "cfg",
)  # fmt: skip
no_flashinfer = pytest.mark.skipif(
    importlib.util.find_spec("flashinfer") is not None, reason="flashinfer is installed here"
)


def test_cpu_always_gets_the_torch_backend() -> None:
    assert resolve_backend("auto", CPU) == "torch"
    with pytest.raises(ValueError, match=r"engine\.attention: flashinfer: .* needs a CUDA device"):
        resolve_backend("flashinfer", CPU)
    with pytest.raises(ValueError, match="unknown attention backend 'fa3'"):
        resolve_backend("fa3", CPU)


@no_flashinfer
def test_auto_on_cuda_without_flashinfer_falls_back_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert resolve_backend("auto", CUDA) == "torch"
    assert "flashinfer is not installed" in caplog.text


@no_flashinfer
def test_asking_for_flashinfer_without_it_names_the_setting_and_the_fix() -> None:
    assert resolve_backend("flashinfer", CUDA) == "flashinfer"  # as asked; the import fails
    with pytest.raises(ImportError, match=r"engine\.attention: flashinfer: cannot import it"):
        make_backend("flashinfer", CUDA, CFG, torch.bfloat16)
