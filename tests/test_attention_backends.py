"""Picking the attention backend: flashinfer only for the models its kernels cover (dtype,
head_dim), imported only when used; a missing flashinfer or a model it cannot run either
falls back (auto, with a warning naming why) or fails naming the setting and the reason."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch

from trd.models.attention import make_backend, resolve_backend, support
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


def shaped(head_dim: int, heads: int = 16, kv_heads: int = 8) -> ModelConfig:
    return ModelConfig.from_dict(
        {"model_type": "qwen3", "num_hidden_layers": 1, "num_attention_heads": heads,
         "num_key_value_heads": kv_heads, "head_dim": head_dim, "hidden_size": 64,
         "intermediate_size": 8, "vocab_size": 8},
        f"head_dim {head_dim}",
    )  # fmt: skip


def test_cpu_always_gets_the_torch_backend() -> None:
    assert resolve_backend("auto", CPU, CFG, "float32") == "torch"
    with pytest.raises(ValueError, match=r"engine\.attention: flashinfer: .* needs a CUDA device"):
        resolve_backend("flashinfer", CPU, CFG, "bfloat16")
    with pytest.raises(ValueError, match="unknown attention backend 'fa3'"):
        resolve_backend("fa3", CPU, CFG, "float32")


@pytest.mark.parametrize(
    ("head_dim", "dtype", "backend", "why"),
    [
        (128, "bfloat16", "flashinfer", ""),
        (64, "float16", "flashinfer", ""),
        (256, "bfloat16", "flashinfer", ""),
        (32, "bfloat16", "torch", "head_dim 32: flashinfer's kernels exist for head_dim 64, 128"),
        (96, "bfloat16", "torch", "head_dim 96: "),  # not a multiple of 64: flashinfer #4299
        (128, "float32", "torch", "dtype float32: flashinfer runs bfloat16 and float16 only"),
    ],
)
def test_auto_on_cuda_takes_flashinfer_only_for_models_its_kernels_cover(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    head_dim: int, dtype: str, backend: str, why: str,
) -> None:  # fmt: skip
    monkeypatch.setattr(support, "flashinfer_installed", lambda: True)
    cfg = shaped(head_dim, 28, 4)  # any query/KV ratio (7 here): tensor-core decode
    with caplog.at_level(logging.WARNING):
        assert resolve_backend("auto", CUDA, cfg, dtype) == backend
    assert (why in caplog.text) if why else not caplog.text
    if why:  # asked for explicitly, the same model is refused with the same reason
        with pytest.raises(ValueError, match=rf"engine\.attention: flashinfer: {why}"):
            resolve_backend("flashinfer", CUDA, cfg, dtype)
    assert resolve_backend("torch", CUDA, cfg, dtype) == "torch"


@no_flashinfer
def test_auto_on_cuda_without_flashinfer_falls_back_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert resolve_backend("auto", CUDA, shaped(128), "bfloat16") == "torch"
    assert "flashinfer is not installed" in caplog.text


@no_flashinfer
def test_asking_for_flashinfer_without_it_names_the_setting_and_the_fix() -> None:
    # As asked; the import fails.
    assert resolve_backend("flashinfer", CUDA, shaped(128), "bfloat16") == "flashinfer"
    with pytest.raises(ImportError, match=r"engine\.attention: flashinfer: cannot import it"):
        make_backend("flashinfer", CUDA, CFG, torch.bfloat16)
