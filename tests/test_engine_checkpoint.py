"""A directory that is not a servable checkpoint fails, at read or at load, naming the culprit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.models.checkpoint import CheckpointError
from trd.testing.tinymodels.build import save_random_checkpoint


def load(path: Path, dtype: str = "float32") -> Engine:
    """What an engine process does with its spec: read the checkpoint, load the weights."""
    return Engine(EngineSpec.of(path, dtype=dtype, kv_tokens=64))


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_checkpoint(
        "llama", tmp_path_factory.mktemp("good"), seed=1, tie_word_embeddings=False
    )


def broken(good: Path, tmp_path: Path) -> Path:
    out = tmp_path / "ckpt"
    shutil.copytree(good, out)
    return out


def edit_config(path: Path, **changes: object) -> None:
    cfg = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a directory"):
        load(tmp_path / "missing")


def test_missing_config(good: Path, tmp_path: Path) -> None:
    path = broken(good, tmp_path)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"missing config\.json"):
        load(path)


def test_config_not_json(good: Path, tmp_path: Path) -> None:
    path = broken(good, tmp_path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config.json: not valid JSON"):
        load(path)


def test_unsupported_architecture(good: Path, tmp_path: Path) -> None:
    path = broken(good, tmp_path)
    edit_config(path, model_type="gpt2")
    with pytest.raises(CheckpointError, match="model_type 'gpt2' is not supported"):
        load(path)


def test_missing_field(good: Path, tmp_path: Path) -> None:
    path = broken(good, tmp_path)
    edit_config(path, hidden_size=None)
    with pytest.raises(CheckpointError, match="missing field 'hidden_size'"):
        load(path)


def test_unsupported_rope_scaling(good: Path, tmp_path: Path) -> None:
    path = broken(good, tmp_path)
    edit_config(path, rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "factor": 4.0})
    with pytest.raises(CheckpointError, match="rope_type 'longrope' is not supported"):
        load(path)


def test_no_weight_files(good: Path, tmp_path: Path) -> None:
    path = broken(good, tmp_path)
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*.safetensors weight files"):
        load(path)


def test_garbage_weight_file(good: Path, tmp_path: Path) -> None:
    path = broken(good, tmp_path)
    (path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated safetensors header"):
        load(path)


def test_weight_data_cut_short(good: Path, tmp_path: Path) -> None:
    path = broken(good, tmp_path)
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])  # the header is whole, the data is not
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read safetensors"):
        load(path)


def test_weights_from_another_shape(good: Path, tmp_path: Path) -> None:
    path = broken(good, tmp_path)
    edit_config(path, intermediate_size=48)
    with pytest.raises(CheckpointError, match=r"mlp.*has shape"):
        load(path)


def test_weights_missing_a_tensor(good: Path, tmp_path: Path) -> None:
    path = broken(good, tmp_path)
    edit_config(path, num_hidden_layers=9)
    with pytest.raises(CheckpointError, match=r"missing: \['model.layers.2"):
        load(path)


def test_bad_dtype(good: Path) -> None:
    with pytest.raises(ValueError, match="dtype 'int8' is not supported"):
        load(good, dtype="int8")
