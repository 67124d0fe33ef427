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
from trd.daemon import main as daemon_main
from trd.devices import GpuInfo
from trd.engines.spec import EngineSpec
from trd.memplan.plan import GIB, MIB
from trd.models.attention import support
from trd.supervisor.deployment import plan_deployment
from trd.testing.shaped import Shape, write_checkpoint

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


@pytest.fixture(scope="module")
def head64(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two tiny Qwen3 checkpoints with head_dim 64, the smallest flashinfer runs."""
    root = tmp_path_factory.mktemp("head64")
    return [write_checkpoint(Shape(f"h64-{t}", 128, 256, 2, 2, 1, tied=t, head_dim=64,
                                   vocab=4096), root) for t in (True, False)]  # fmt: skip


def test_the_plan_reserves_the_graph_pool(
    raw: dict[str, Any], gpu: GpuInfo, head64: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Graphs on: each model's reserve grows by its largest graph's pool (64 x 8 + 1
    tokens, 64 rows), its output buffers, the scratch page and 64 MiB of slack."""
    monkeypatch.setattr(support, "flashinfer_installed", lambda: True)
    for entry, path in zip(raw["models"], head64, strict=True):
        entry |= {"path": str(path), "dtype": "bfloat16"}
    on_cfg = from_dict({**raw, "device": "cuda:1"}, Path("/"))
    on = plan_deployment(on_cfg).plan.models
    off_cfg = {**raw, "device": "cuda:1", "engine": {"cuda_graphs": False}}
    off = plan_deployment(from_dict(off_cfg, Path("/"))).plan.models
    large = yaml.safe_load((head64[1] / "config.json").read_text())
    h, inter, vocab = large["hidden_size"], large["intermediate_size"], large["vocab_size"]
    kv_page = 16 * large["num_hidden_layers"] * large["num_key_value_heads"] * 64 * 2 * 2
    expect = (513 * (4 * h + 2 * inter) + 64 * vocab) * 4 + 64 * vocab * 4 + kv_page + 64 * MIB
    assert on[1].reserve_bytes - off[1].reserve_bytes == expect
    # Both carry the CUDA overheads: flashinfer 136 MiB (128 + 8: the float workspace's
    # floor for 2 heads), context 512 MiB, cuBLAS 64 MiB.
    eager = (1024 * (4 * h + 2 * inter) + 1024 * vocab) * 4  # max_batch_tokens
    assert off[1].reserve_bytes == eager + (136 + 512 + 64) * MIB


def test_models_flashinfer_cannot_run_get_the_torch_backend_and_check_says_so(
    raw: dict[str, Any], gpu: GpuInfo, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The fixtures' head_dim 32 has no flashinfer kernels: torch attention, so neither
    flashinfer's workspaces nor CUDA graphs (which need it) are in the plan."""
    monkeypatch.setattr(support, "flashinfer_installed", lambda: True)
    for entry in raw["models"]:
        entry["dtype"] = "bfloat16"
    launch = plan_deployment(from_dict({**raw, "device": "cuda:1"}, Path("/")))
    why = "head_dim 32: flashinfer's kernels exist for head_dim 64, 128, 256 only"
    assert launch.attention == {"small": ("torch", why), "large": ("torch", why)}
    cfg = yaml.safe_load((Path(raw["models"][1]["path"]) / "config.json").read_text())
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    eager = (1024 * (4 * h + 2 * inter) + 1024 * vocab) * 4  # max_batch_tokens
    assert launch.plan.models[1].reserve_bytes == eager + (512 + 64) * MIB
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**raw, "device": "cuda:1"}))
    assert daemon_main(["--check", "--config", str(config)]) == 0
    assert f"model 'small' attention: torch ({why})" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=rf"model 'small': engine.attention: flashinfer: {why}"):
        plan_deployment(from_dict({**raw, "device": "cuda:1",
                                   "engine": {"attention": "flashinfer"}}, Path("/")))  # fmt: skip
