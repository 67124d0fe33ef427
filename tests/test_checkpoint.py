"""The one checkpoint reader: config.json, safetensors headers, clear errors naming the culprit."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from trd.memplan.plan import ModelMem, model_mem
from trd.models.checkpoint import CheckpointError, ModelConfig, read_checkpoint

# Qwen3-0.6B's published config.json, the keys the planner reads.
QWEN3_06B = {
    "model_type": "qwen3", "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 1024, "intermediate_size": 3072,
    "vocab_size": 151936,
}  # fmt: skip


def test_config_defaults_head_dim_and_kv_heads() -> None:
    cfg = ModelConfig.from_dict(
        {"model_type": "llama", "num_hidden_layers": 3, "num_attention_heads": 8,
         "hidden_size": 256, "intermediate_size": 512, "vocab_size": 1000},
        source="cfg",
    )  # fmt: skip
    # No GQA key: kv heads = attention heads; no head_dim: 256 // 8.
    assert (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim) == (3, 8, 32)
    assert cfg.kv_bytes_per_token("bfloat16") == 3 * 8 * 32 * 2 * 2


QWEN2 = {**QWEN3_06B, "model_type": "qwen2", "head_dim": None, "mlp_bias": True}
UNSUPPORTED: list[tuple[dict[str, Any], str]] = [
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported (only silu)"),
    ({"use_sliding_window": True, "max_window_layers": 21},
     "use_sliding_window true is not supported (layers from max_window_layers 21 on"),
    ({"layer_types": ["full_attention", "sliding_attention"]},
     "layer_types 'sliding_attention' is not supported (only full_attention)"),
    ({"quantization_config": {"quant_method": "awq"}}, "quantization_config: quantized weights"),
    ({"head_dim": 63}, "head_dim 63 is odd; rope needs pairs"),
    ({"rope_scaling": {"type": "su", "factor": 2.0}}, "rope_scaling.rope_type 'su' is not"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("keys", "error"), UNSUPPORTED, ids=[next(iter(k)) for k, _ in UNSUPPORTED]
)
def test_what_the_model_code_does_not_implement_is_refused_by_key(
    keys: dict[str, object], error: str
) -> None:
    with pytest.raises(CheckpointError) as info:
        ModelConfig.from_dict({**QWEN2, **keys}, source="config.json")
    assert str(info.value).startswith(f"config.json: {error}")


def test_config_quirks_follow_transformers() -> None:
    qwen2 = ModelConfig.from_dict(QWEN2, source="c")
    # Qwen2: q/k/v biases, never o or MLP biases (transformers ignores the keys there);
    # a sliding window that no layer uses is no sliding window.
    assert (qwen2.qkv_bias, qwen2.o_bias, qwen2.mlp_bias) == (True, False, False)
    windowless = {**QWEN2, "use_sliding_window": True, "max_window_layers": 28}
    assert ModelConfig.from_dict(windowless, source="c").num_layers == 28
    # Qwen3 without head_dim: transformers' default 128, not hidden / heads (64 here).
    no_head_dim = {k: v for k, v in QWEN3_06B.items() if k != "head_dim"}
    assert ModelConfig.from_dict(no_head_dim, source="c").head_dim == 128


def _write_config(model_dir: Path, config: dict[str, object]) -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config))


def test_params_from_mixed_dtype_headers(tmp_path: Path) -> None:
    save_file(
        {
            "a": np.zeros((3, 4), np.float32),
            "b": np.zeros(5, np.float16),
            "c": np.zeros((2, 3, 2), np.int64),
        },
        str(tmp_path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    _write_config(tmp_path, QWEN3_06B)
    ckpt = read_checkpoint(tmp_path)
    assert ckpt.num_params == 12 + 5 + 12
    assert ckpt.weight_bytes("bfloat16") == 58
    with pytest.raises(ValueError, match="dtype 'int8' is not supported"):
        ckpt.weight_bytes("int8")


def test_sharded_float32_checkpoint(tmp_path: Path) -> None:
    shards: list[dict[str, np.ndarray]] = [
        {"w1": np.ones((4, 8), np.float32), "w2": np.ones(8, np.float32)},
        {"w3": np.ones((2, 2, 2), np.float32)},
    ]
    for i, tensors in enumerate(shards, 1):
        save_file(tensors, str(tmp_path / f"model-0000{i}-of-00002.safetensors"))
    _write_config(tmp_path, {**QWEN3_06B, "num_key_value_heads": None})
    ckpt = read_checkpoint(tmp_path)
    assert ckpt.num_params == 48
    nbytes = sum(a.nbytes for t in shards for a in t.values())
    assert ckpt.weight_bytes("float32") == nbytes == 192
    assert len(ckpt.weight_files) == 2
    assert (ckpt.config.num_kv_heads, ckpt.config.head_dim) == (16, 128)
    # v = 28 layers x 16 kv heads x 128 x 2 x 4 B; R = 8 tokens x 162_176 x 4 B
    assert model_mem("m", ckpt, "float32", "cpu", 8) == ModelMem(
        "m", "cpu", 192, 458_752, 5_189_632
    )


def test_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=f"{tmp_path}: missing config.json"):
        read_checkpoint(tmp_path)
    _write_config(tmp_path, QWEN3_06B)
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors weight files"):
        read_checkpoint(tmp_path)


def test_config_missing_key(tmp_path: Path) -> None:
    save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "model.safetensors"))
    _write_config(tmp_path, {k: v for k, v in QWEN3_06B.items() if k != "vocab_size"})
    with pytest.raises(CheckpointError, match=r"config\.json: missing field 'vocab_size'"):
        read_checkpoint(tmp_path)


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b"\x10\x00", "no header length"),
        (struct.pack("<Q", 1000) + b'{"w": ', "truncated safetensors header (6 of 1000"),
        (struct.pack("<Q", 5) + b"\xff\xfegar", "header is not valid JSON"),
        (struct.pack("<Q", 2) + b"[]", "header is not a JSON object"),
        (struct.pack("<Q", 12) + b'{"w": {"x":1', "not valid JSON"),
        (struct.pack("<Q", 21) + b'{"w": {"shape": "a"}}', "tensor 'w' has no valid shape"),
    ],
)
def test_bad_safetensors_header(tmp_path: Path, content: bytes, error: str) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    _write_config(tmp_path, QWEN3_06B)
    with pytest.raises(CheckpointError, match=str(path)) as info:
        read_checkpoint(tmp_path)
    assert error in str(info.value)
