"""Checkpoint reading: config.json shapes, safetensors headers, clear errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from trd.memplan.checkpoint import (
    CheckpointError,
    ModelShape,
    read_weight_params,
    weight_bytes,
)
from trd.memplan.plan import ModelMem, model_mem

# Qwen3-0.6B's published config.json, the keys the planner reads.
QWEN3_06B = {
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "hidden_size": 1024, "intermediate_size": 3072, "vocab_size": 151936,
}  # fmt: skip


def test_config_defaults_head_dim_and_kv_heads() -> None:
    shape = ModelShape.from_config(
        {"num_hidden_layers": 3, "num_attention_heads": 8, "hidden_size": 256,
         "intermediate_size": 512, "vocab_size": 1000},
        num_params=7, source="cfg",
    )  # fmt: skip
    # No GQA key: kv heads = attention heads; no head_dim: 256 // 8.
    assert shape == ModelShape(3, 8, 32, 256, 512, 1000, 7)


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
    assert read_weight_params(tmp_path) == 12 + 5 + 12
    assert weight_bytes(tmp_path, "bfloat16") == 58
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        weight_bytes(tmp_path, "int8")


def test_sharded_float32_checkpoint(tmp_path: Path) -> None:
    shards = [
        {"w1": np.ones((4, 8), np.float32), "w2": np.ones(8, np.float32)},
        {"w3": np.ones((2, 2, 2), np.float32)},
    ]
    for i, tensors in enumerate(shards, 1):
        save_file(tensors, str(tmp_path / f"model-0000{i}-of-00002.safetensors"))
    _write_config(tmp_path, {**QWEN3_06B, "num_key_value_heads": None})
    assert read_weight_params(tmp_path) == 48
    nbytes = sum(a.nbytes for t in shards for a in t.values())
    assert weight_bytes(tmp_path, "float32") == nbytes == 192
    shape = ModelShape.from_dir(tmp_path)
    assert (shape.num_params, shape.num_kv_heads, shape.head_dim) == (48, 16, 128)
    # v = 28 layers x 16 kv heads x 128 x 2 x 4 B; R = 8 tokens x 162_176 x 4 B
    assert model_mem("m", tmp_path, "float32", "cpu", 8, 0) == ModelMem(
        "m", "cpu", 192, 458_752, 5_189_632
    )


def test_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=f"{tmp_path}: not a checkpoint, no config.json"):
        ModelShape.from_dir(tmp_path)
    _write_config(tmp_path, QWEN3_06B)
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors file"):
        ModelShape.from_dir(tmp_path)


def test_config_missing_key(tmp_path: Path) -> None:
    save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "model.safetensors"))
    _write_config(tmp_path, {k: v for k, v in QWEN3_06B.items() if k != "vocab_size"})
    with pytest.raises(CheckpointError, match=r"config\.json: missing required key 'vocab_size'"):
        ModelShape.from_dir(tmp_path)


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
    with pytest.raises(CheckpointError, match=str(path)) as info:
        read_weight_params(tmp_path)
    assert error in str(info.value)
