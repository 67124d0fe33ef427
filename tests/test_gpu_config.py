"""The GPU settings without a GPU: CUDA graphs and their buckets in the config, float32 on
CUDA refused before anything starts, the GPU handed to engines by UUID, the graph pool in
the memory plan. NVML's probe is replaced by a fake H200 where a GPU is needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from trd import devices
from trd.config import ConfigError, from_dict
from trd.devices import GpuInfo
from trd.engines.spec import EngineSpec
from trd.memplan.plan import GIB, MIB
from trd.supervisor.deployment import plan_deployment

H200 = GpuInfo(1, "NVIDIA H200", 141 * GIB, 140 * GIB, "GPU-0c5e7a1f-0000-4000-8000-000000000001")
OTHER = GpuInfo(0, "NVIDIA H200", 141 * GIB, 140 * GIB, "GPU-0c5e7a1f-0000-4000-8000-000000000000")


@pytest.fixture
def raw(tiny_models: dict[str, Path]) -> dict[str, Any]:
    return {
        "device": "cpu",
        "models": [
            {"name": "small", "path": str(tiny_models["small"])},
            {"name": "large", "path": str(tiny_models["large"])},
        ],
    }


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> GpuInfo:
    monkeypatch.setattr(devices, "probe_gpus", lambda: [OTHER, H200])
    return H200


@pytest.mark.parametrize(("text", "on"), [("on", True), ("off", False), ("true", True)])
def test_cuda_graphs_read_yaml_on_and_off(raw: dict[str, Any], text: str, on: bool) -> None:
    engine = yaml.safe_load(f"cuda_graphs: {text}\ngraph_extend_lens: [2, 4]")
    cfg = from_dict({**raw, "engine": engine}, Path("/"))
    assert cfg.engine.cuda_graphs is on
    assert cfg.engine.graph_extend_lens == (2, 4)  # a tuple: the settings stay hashable
    assert cfg.engine.graph_batch_sizes == (1, 2, 4, 8, 16, 24, 32, 48, 64)


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"cuda_graphs": "yes"}, "engine.cuda_graphs: 'yes': expected true or false (on or off)"),
        ({"graph_batch_sizes": [8, 4]}, "engine.graph_batch_sizes: [8, 4]: expected a non-empty"),
        ({"graph_extend_lens": 4}, "engine.graph_extend_lens: 4: expected a non-empty"),
    ],
)
def test_bad_graph_settings_are_named(raw: dict[str, Any], engine: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_dict({**raw, "engine": engine}, Path("/"))
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_full_precision_on_cuda_is_refused_at_config_time(raw: dict[str, Any], dtype: str) -> None:
    raw["models"][1]["dtype"] = dtype
    with pytest.raises(ConfigError, match=rf"models\[1\]\.dtype: '{dtype}': flashinfer"):
        from_dict({**raw, "device": "cuda"}, Path("/"))
    # The torch attention runs any dtype on CUDA.
    from_dict({**raw, "device": "cuda", "engine": {"attention": "torch"}}, Path("/"))


def test_full_precision_on_an_auto_gpu_is_refused_by_the_spec(
    raw: dict[str, Any], gpu: GpuInfo, tiny_models: dict[str, Path]
) -> None:
    raw["models"][0]["dtype"] = "float32"
    cfg = from_dict({**raw, "device": "auto"}, Path("/"))  # the device is not known yet (GPU 0)
    with pytest.raises(ValueError, match=r"engine 'small': dtype: 'float32': flashinfer, the"):
        plan_deployment(cfg)
    with pytest.raises(ValueError, match=r"choose one of them, or engine\.attention: torch"):
        EngineSpec.of(tiny_models["small"], device="cuda:0")  # float32 by default


def test_engines_get_the_gpu_by_uuid_as_cuda_0(raw: dict[str, Any], gpu: GpuInfo) -> None:
    launch = plan_deployment(from_dict({**raw, "device": "cuda:1"}, Path("/")))
    assert (launch.device, launch.gpu_uuid) == ("cuda:1", gpu.uuid)
    for spec in launch.specs:
        assert isinstance(spec, EngineSpec)  # every model is local here
        assert spec.device == "cuda:0"
        assert spec.env == {"CUDA_VISIBLE_DEVICES": gpu.uuid, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    cpu = plan_deployment(from_dict(raw, Path("/")))
    assert cpu.gpu_uuid == ""
    for spec in cpu.specs:
        assert isinstance(spec, EngineSpec)
        assert spec.env == {} and spec.device == "cpu"


def test_the_plan_reserves_the_graph_pool(raw: dict[str, Any], gpu: GpuInfo) -> None:
    """Graphs on: each model's reserve grows by its largest graph's pool (64 x 8 + 1
    tokens, 64 rows), its output buffers, the scratch page and 64 MiB of slack."""
    on = plan_deployment(from_dict({**raw, "device": "cuda:1"}, Path("/"))).plan.models
    off_cfg = {**raw, "device": "cuda:1", "engine": {"cuda_graphs": False}}
    off = plan_deployment(from_dict(off_cfg, Path("/"))).plan.models
    large = yaml.safe_load((Path(raw["models"][1]["path"]) / "config.json").read_text())
    h, inter, vocab = large["hidden_size"], large["intermediate_size"], large["vocab_size"]
    kv_page = 16 * large["num_hidden_layers"] * large["num_key_value_heads"] * 32 * 2 * 2
    expect = (513 * (4 * h + 2 * inter) + 64 * vocab) * 4 + 64 * vocab * 4 + kv_page + 64 * MIB
    assert on[1].reserve_bytes - off[1].reserve_bytes == expect
    # Both carry the CUDA overheads: flashinfer 264 MiB, context 512 MiB, cuBLAS 64 MiB.
    assert off[1].reserve_bytes > 840 * MIB
