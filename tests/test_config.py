"""Config loading: defaults, the example config, and every bad value named with its key."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from trd.config import Address, Config, ConfigError, default_routing, from_dict, load_config
from trd.config_reader import Section
from trd.daemon import EXIT_CONFIG, _config, parse_args
from trd.daemon import main as daemon_main
from trd.demo.pair import (
    DEMO_QUANTIZATION,
    MAX_MODEL_LEN,
    RSTITCH_TAU,
    ensure_demo_pair,
)
from trd.engines.spec import EngineSpec
from trd.memplan.plan import PlanError
from trd.protocol import NO_ROUTING, RoutingParams
from trd.supervisor.deployment import plan_deployment, resolve_device

CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache"
EXAMPLE = Path(__file__).resolve().parent.parent / "systemd" / "config.example.yaml"


@pytest.fixture
def raw(tiny_models: dict[str, Path]) -> dict[str, Any]:
    return {
        "device": "cpu",
        "models": [
            {"name": "small", "path": str(tiny_models["small"]), "dtype": "float32"},
            {"name": "large", "path": str(tiny_models["large"])},
        ],
    }


def test_defaults_fill_a_minimal_config(raw: dict[str, Any]) -> None:
    cfg = from_dict(raw, Path("/"))
    assert cfg.listen == Address("127.0.0.1", 8000)
    assert cfg.admin.is_loopback
    assert [(m.name, m.dtype) for m in cfg.models] == [("small", "float32"), ("large", "bfloat16")]
    assert cfg.max_model_len == 4096  # the fixtures' max_position_embeddings
    assert (cfg.policy.name, cfg.max_retries, cfg.grace_s) == ("rstitch", 3, 30.0)
    assert cfg.threads() >= 1


def test_threads_alone_widens_to_the_cores_only_when_threads_is_auto(
    raw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    cfg = from_dict(raw, Path("/"))
    assert (cfg.threads(), cfg.threads_alone()) == (4, 8)
    raw["engine"] = {"threads": 2}  # an operator's limit stays the limit
    assert from_dict(raw, Path("/")).threads_alone() == 2
    raw["engine"] = {"threads": 2, "threads_alone": 6}
    assert from_dict(raw, Path("/")).threads_alone() == 6


def test_example_config_is_valid_with_real_model_paths(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    for m in data["models"]:
        m["path"] = str(tiny_models[m["name"]])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    assert str(cfg.admin) == "unix:/run/tokenrouterd/admin.sock"
    assert cfg.policy.params == {"threshold": 0.03}
    assert cfg.thresholds == {"small": (1,), "large": (1, 2, 4)}


def test_relative_model_paths_are_taken_from_the_config_folder(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    shutil.copytree(tiny_models["small"], tmp_path / "models" / "small")
    (tmp_path / "c.yaml").write_text("models: [{name: s, path: models/small}]\n")
    assert load_config(tmp_path / "c.yaml").models[0].path == tmp_path / "models" / "small"


def _set(raw: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    *parents, last = dotted.split(".")
    node: Any = out
    for p in parents:
        node = node[int(p)] if p.isdigit() else node.setdefault(p, {})
    node[int(last) if last.isdigit() else last] = value
    return out


BAD = [  # (key to set, value, expected start of the message)
    ("listen", "localhost", "listen: 'localhost'"),
    (
        "listen",
        "127.0.0.1:70000",
        "listen: '127.0.0.1:70000': expected 'host:port' with a port "
        "in 0..65535 (0: any free port)",
    ),
    ("listen", "unix:/tmp/x.sock", "listen: 'unix:/tmp/x.sock'"),
    ("admin", "0.0.0.0:8001", "admin: '0.0.0.0:8001': the admin API must listen on loopback"),
    ("admin", "unix:run/admin.sock", "admin: 'unix:run/admin.sock': the unix socket path"),
    ("device", "tpu", "device: 'tpu'"),
    ("mps", "maybe", "mps: 'maybe'"),
    ("mps", True, "mps: True: expected auto, required or off"),  # YAML's `on`: ambiguous
    ("admin_token", "short", "admin_token: '<hidden>': expected a printable string"),
    ("api_key_file", "", "api_key_file: '': expected a non-empty string"),
    ("api_key_metrics", "yes", "api_key_metrics: 'yes': expected true or false"),
    ("ssl_certfile", 443, "ssl_certfile: 443: expected a non-empty string"),
    ("stall_timeout_s", 0, "stall_timeout_s: 0: must be >= 1"),
    ("memory.fraction", 1.5, "memory.fraction: 1.5: must be <= 1"),
    ("memory.budget_gib", -1, "memory.budget_gib: -1"),
    ("memory.max_kv_tokens", 0, "memory.max_kv_tokens: 0"),
    ("memory.budget", 3, "memory.budget: 3: unknown key"),
    ("max_model_len", 100000, "max_model_len: 100000: exceeds the models' smallest context"),
    ("max_model_len", "long", "max_model_len: 'long': expected an integer"),
    ("max_inflight", 0, "max_inflight: 0: must be >= 1"),
    ("models", [], "models: []: at least one model"),
    ("models.0.dtype", "int8", "models[0].dtype: 'int8'"),
    ("models.1.path", "/nonexistent/model", "models[1].path: '/nonexistent/model': not a servable"),
    ("models.1.name", "small", "models[1].name: 'small': duplicate model name"),
    ("models.0.gpu", 1, "models[0].gpu: 1: unknown key"),
    ("models.1.prefix_cache", "off", "models[1].prefix_cache: 'off': expected true or false"),
    ("engine.prefix_cache", 0, "engine.prefix_cache: 0: expected true or false"),
    ("models.1.prefill_ahead", 1, "models[1].prefill_ahead: 1: expected true or false"),
    ("policy.name", "nope", "policy.name: 'nope': unknown policy"),
    ("policy.tau", 0.5, "policy.tau: 0.5: unknown parameter of rstitch"),
    ("policy.threshold", 7, "policy.threshold: 7: expected a number in [0, 1]"),
    ("batching.thresholds", {"huge": [1]}, "batching.thresholds.huge: [1]: no such model"),
    ("batching.thresholds", {"large": [0, 2]}, "batching.thresholds.large: [0, 2]"),
    (
        "batching.thresholds",
        {"large": [1, 10**6]},
        "batching.thresholds.large: [1, 1000000]: expected 1 to 256 integers",
    ),
    ("batching.max_wait_ms", -5, "batching.max_wait_ms: -5"),
    ("engine.page_size", 0, "engine.page_size: 0: must be >= 1"),
    ("engine.threads", "many", "engine.threads: 'many': expected an integer"),
    ("engine.threads", 0, "engine.threads: 0: must be >= 1"),
    ("engine.threads_alone", 0, "engine.threads_alone: 0: must be >= 1"),
    ("engine.attention", "xformers", "engine.attention: 'xformers': expected one of"),
    ("engine.pag_size", 16, "engine.pag_size: 16: unknown key"),
    ("engine.pending_kv", "no", "engine.pending_kv: 'no': expected true or false"),
    ("engine.grammar_cache", 0, "engine.grammar_cache: 0: must be >= 1"),
    ("engine.step_sync", 1, "engine.step_sync: 1: expected true or false"),
    ("engine.spin_ms", -1, "engine.spin_ms: -1: must be >= 0"),
    ("engine.cpu_linear", "mkl", "engine.cpu_linear: 'mkl': expected one of"),
    ("batching.auto_interval_s", -1, "batching.auto_interval_s: -1"),
    ("shutdown.grace_s", "soon", "shutdown.grace_s: 'soon': expected a number"),
    ("restart.max_retries", -1, "restart.max_retries: -1: must be >= 0"),
    ("responses.max_stored", -1, "responses.max_stored: -1: must be >= 0"),
    ("lisen", "127.0.0.1:8000", "lisen: '127.0.0.1:8000': unknown key"),
    ("models.1.draft", "huge", "models[1].draft: 'huge': another model of this config"),
    ("models.1.draft", "large", "models[1].draft: 'large': another model of this config"),
    ("models.1.draft", 3, "models[1].draft: 3: expected a non-empty string"),
    ("engine.draft_tokens", 0, "engine.draft_tokens: 0: must be >= 1"),
    ("engine.draft_rows", 1, "engine.draft_rows: 1: must be >= 2"),
    ("policy.request_model", "huge", "policy.request_model: 'huge': not a served model"),
    ("policy.request_model", 1, "policy.request_model: 1: a served model's name"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_bad_values_name_key_value_and_reason(
    raw: dict[str, Any], key: str, value: Any, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        from_dict(_set(raw, key, value), Path("/"))
    assert str(err.value).startswith(message)


def test_models_may_pad_one_tokenizer_to_different_vocab_sizes(
    raw: dict[str, Any], tmp_path: Path
) -> None:
    # DeepSeek-R1-Distill-Qwen-1.5B and -32B: vocab_size 151936 and 152064, one tokenizer.
    # Padding is what the tokenizer check ignores (tests/test_tokenizer_identity.py: the rest).
    other = tmp_path / "other"
    shutil.copytree(raw["models"][1]["path"], other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "vocab_size": 4096}))
    models = from_dict(_set(raw, "models.1.path", str(other)), Path("/")).models
    # Both models local: a missing checkpoint would shorten the list.
    ckpts = [m.checkpoint for m in models if m.checkpoint is not None]
    assert [c.config.vocab_size for c in ckpts] == [2048, 4096]
    assert [c.vocab_limit for c in ckpts] == [2048, 2048]


def test_unreadable_or_non_mapping_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"config: \[1, 2\]: expected a mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "broken.yaml").write_text("models: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "broken.yaml")


def test_demo_config_serves_small_and_large_with_rstitch(tiny_models: dict[str, Path]) -> None:
    pair = ensure_demo_pair("tiny", CACHE_DIR)
    assert pair.models == {"small": tiny_models["small"], "large": tiny_models["large"]}
    cfg = Config.demo(pair, 9000)
    assert [m.name for m in cfg.models] == ["small", "large"]
    assert cfg.policy.params["threshold"] == RSTITCH_TAU["tiny"]
    assert cfg.max_model_len == MAX_MODEL_LEN["tiny"]
    assert (cfg.policy.name, cfg.device, str(cfg.listen), str(cfg.admin)) == (
        "rstitch", "cpu", "127.0.0.1:9000", "127.0.0.1:9001",
    )  # fmt: skip
    held = Config.demo(pair, 9000, large_share=0.7)
    assert held.policy.params == {"threshold": RSTITCH_TAU["tiny"], "target_large_share": 0.7}
    # A request's own share is off by default; given, the share control replaces it
    assert pair.request_share is None
    shared = dataclasses.replace(pair, request_share=0.3)
    assert Config.demo(shared, 9000).policy.params == {
        "threshold": RSTITCH_TAU["tiny"], "request_large_share": 0.3}  # fmt: skip
    assert "request_large_share" not in Config.demo(shared, 9000, 0.7).policy.params
    assert [m.dtype for m in cfg.models] == ["float32", "float32"]
    # The pair says the dtype it is served in: the Qwen demo pair's bfloat16 checkpoints.
    served = Config.demo(dataclasses.replace(pair, dtype="bfloat16"), 9000)
    assert [m.dtype for m in served.models] == ["bfloat16", "bfloat16"]


def test_demo_large_share_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert daemon_main(["--demo", "tiny", "--large-share", "1.5", "--check"]) == EXIT_CONFIG
    assert "policy.target_large_share: 1.5" in capsys.readouterr().err
    refused = [
        (["--config", "x.yaml", "--large-share", "0.5"], "--large-share goes with --demo"),
        (["--config", "x.yaml", "--request-share", "0.5"], "--request-share goes with --demo"),
        (["--demo", "--request-share", "1"], "'1' is not a share in (0, 1) or off"),
        (["--demo", "--request-share", "0"], "'0' is not a share"),
        (["--demo", "--request-share", "nan"], "'nan' is not a share"),
        (["--demo", "--request-share", "none"], "'none' is not a share"),
        (["--demo", "--request-share", "0.2", "--large-share", "0.2"], "not both"),
    ]
    for argv, message in refused:
        with pytest.raises(SystemExit) as exc:
            daemon_main(argv)
        assert exc.value.code == 2
        assert message in capsys.readouterr().err, argv


def test_a_draft_and_a_request_model_reach_the_specs_and_the_plan(raw: dict[str, Any]) -> None:
    """The large model verifies the small one's proposals: its spec names the draft, the
    plan counts the draft's weights and KV in its engine; requests without routing are
    the large model's; a request share beside request_model is refused."""
    plain = from_dict(raw, Path("/"))
    cfg = from_dict(_set(_set(raw, "models.1.draft", "small"), "policy.request_model", "large"),
                    Path("/"))  # fmt: skip
    assert default_routing(plain) == NO_ROUTING
    assert default_routing(cfg) == RoutingParams(model=1)
    specs = {s.name: s for s in plan_deployment(cfg).specs if isinstance(s, EngineSpec)}
    assert specs["small"].draft is None
    draft = specs["large"].draft
    assert draft is not None and draft.checkpoint.path == cfg.models[0].path
    before = {m.name: m for m in plan_deployment(plain).plan.models}
    after = {m.name: m for m in plan_deployment(cfg).plan.models}
    small = before["small"]
    assert after["large"].weight_bytes == before["large"].weight_bytes + small.weight_bytes
    assert after["large"].kv_bytes_per_token == (before["large"].kv_bytes_per_token
                                                 + small.kv_bytes_per_token)  # fmt: skip
    both = _set(_set(raw, "policy.request_model", "large"), "policy.request_large_share", 0.3)
    refusal = "policy.request_model: 'large': a served model's name, without request_large"
    with pytest.raises(ConfigError, match=re.escape(refusal)):
        from_dict(both, Path("/"))


def test_demo_speculates_where_its_pair_does(capsys: pytest.CaptureFixture[str]) -> None:
    """--demo qwen: the large model drafts with the small one and writes requests without
    routing; a share asked for routes them instead (the draft stays); tiny: off."""
    pair = ensure_demo_pair("tiny", CACHE_DIR)
    assert not pair.speculate
    on = dataclasses.replace(pair, speculate=True)
    cfg = Config.demo(on, 9000)
    assert [m.draft for m in cfg.models] == [None, "small"]
    assert default_routing(cfg) == RoutingParams(model=1)
    assert default_routing(Config.demo(dataclasses.replace(on, request_share=0.3), 9000)) == (
        RoutingParams(large_share=0.3))  # fmt: skip
    assert default_routing(Config.demo(on, 9000, large_share=0.3)) == NO_ROUTING
    assert daemon_main(["--demo", "tiny", "--speculate", "on", "--check"]) == 0
    out = capsys.readouterr().out
    assert "speculative decoding: large verifies small's proposals (4 a step" in out
    assert "requests without routing: large writes every token" in out
    assert daemon_main(["--demo", "tiny", "--check"]) == 0
    assert "speculative decoding: off" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        daemon_main(["--config", "x.yaml", "--speculate", "on"])
    assert exc.value.code == 2
    assert "--speculate goes with --demo" in capsys.readouterr().err


def test_demo_request_share_reaches_the_config() -> None:
    cfg = _config(parse_args(["--demo", "tiny", "--request-share", "0.25"]))
    assert cfg.policy.params["request_large_share"] == 0.25
    assert "request_large_share" not in _config(parse_args(["--demo", "tiny"])).policy.params
    assert parse_args(["--demo", "--request-share", "off"]).request_share == 0.0  # None


def test_demo_weights_default_per_pair_and_quantization_goes_with_demo(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert DEMO_QUANTIZATION == {"qwen": "int8,int4", "tiny": "none"}  # --demo's default
    assert daemon_main(["--demo", "tiny", "--check"]) == 0
    assert "quantization" not in capsys.readouterr().out  # the fixtures as built
    assert daemon_main(["--demo", "tiny", "--quantization", "int8", "--check"]) == 0
    out = capsys.readouterr().out
    assert "model 'small' quantization int8" in out
    # engine.quant_dense_from's default: the kernel at every row count, nothing measured
    assert "model 'small' linears run dense from rows: never (engine.quant_dense_from)" in out
    with pytest.raises(SystemExit) as exc:
        daemon_main(["--config", "x.yaml", "--quantization", "int8"])
    assert exc.value.code == 2
    assert "--quantization goes with --demo" in capsys.readouterr().err
    # SMALL,LARGE: each model its own; anything else is refused before a model is built
    assert daemon_main(["--demo", "tiny", "--quantization", "none,int4", "--check"]) == 0
    out = capsys.readouterr().out
    assert "model 'large' quantization int4" in out and "model 'small' quantization" not in out
    for spec in ("int8,int2", "int8,int4,none", "", "INT8"):
        with pytest.raises(SystemExit) as exc:
            daemon_main(["--demo", "tiny", "--quantization", spec, "--check"])
        assert exc.value.code == 2
        assert f"--quantization: {spec!r} is not MODE or SMALL,LARGE" in capsys.readouterr().err


def test_plan_caps_cpu_kv_and_sizes_every_engine(raw: dict[str, Any]) -> None:
    raw = {**raw, "max_model_len": 512, "memory": {"max_kv_tokens": 1000}}
    cfg = from_dict(raw, Path("/"))
    launch = plan_deployment(cfg)
    assert launch.device == "cpu"
    # 1000 tokens rounded down to whole 16-token pages, the same for every model.
    assert [s.kv_pages * s.settings.page_size for s in launch.specs] == [992, 992]
    assert [s.index for s in launch.specs] == [0, 1]
    assert launch.specs[1].thresholds == (1,)


def test_onednn_linears_need_cpu_float32_and_reach_the_specs(raw: dict[str, Any]) -> None:
    engine = {"cpu_linear": "onednn"}
    with pytest.raises(ValueError, match=r"engine\.cpu_linear: 'onednn': needs device cpu"):
        plan_deployment(from_dict({**raw, "engine": engine}, Path("/")))  # large: bfloat16
    raw["models"][1]["dtype"] = "float32"
    launch = plan_deployment(from_dict({**raw, "engine": engine}, Path("/")))
    assert [s.settings.cpu_linear for s in launch.specs] == ["onednn", "onednn"]


def test_plan_refuses_a_budget_too_small_for_one_request(raw: dict[str, Any]) -> None:
    cfg = from_dict(_set(raw, "memory", {"budget_gib": 0.001}), Path("/"))
    with pytest.raises(PlanError, match="do not fit"):
        plan_deployment(cfg)


def test_a_gpu_device_without_a_gpu_is_an_error() -> None:
    assert resolve_device("auto", []) == "cpu"
    with pytest.raises(ConfigError, match="device: 'cuda:1': NVML reports no such GPU"):
        resolve_device("cuda:1", [])


def test_check_prints_the_plan_and_bad_configs_exit_2(
    raw: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({**raw, "max_model_len": 256}))
    assert daemon_main(["--check", "--config", str(good)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("config OK: 2 models on cpu, policy rstitch, max_model_len 256")
    assert "KV tokens" in out and "small" in out and "large" in out
    assert "prefix cache: small on, large on" in out
    raw["models"][1]["prefix_cache"] = False
    good.write_text(yaml.safe_dump({**raw, "max_model_len": 256}))
    assert daemon_main(["--check", "--config", str(good)]) == 0
    assert "prefix cache: small on, large off" in capsys.readouterr().out
    specs = plan_deployment(load_config(good)).specs
    assert [s.settings.prefix_cache for s in specs] == [True, False]
    raw["models"][1]["prefill_ahead"] = True  # but its engine has no cache to keep it in
    good.write_text(yaml.safe_dump({**raw, "max_model_len": 256}))
    assert daemon_main(["--check", "--config", str(good)]) == EXIT_CONFIG
    assert "models[1] (large): engine.prefill_ahead: true: needs prefix_cache" in (
        capsys.readouterr().err
    )
    del raw["models"][1]["prefix_cache"]
    good.write_text(yaml.safe_dump({**raw, "max_model_len": 256}))
    assert daemon_main(["--check", "--config", str(good)]) == 0
    assert "prefill ahead: large" in capsys.readouterr().out
    specs = plan_deployment(load_config(good)).specs
    assert [s.settings.prefill_ahead for s in specs] == [False, True]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**raw, "engine": {"page_size": -4}}))
    assert daemon_main(["--check", "--config", str(bad)]) == EXIT_CONFIG
    assert "engine.page_size: -4: must be >= 1" in capsys.readouterr().err


def test_every_key_the_config_reads_is_in_the_example(
    tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example config documents every key: each one the reader asks for appears in it."""
    asked: set[str] = set()
    real_get = Section.get

    def recording_get(self: Section, name: str, *default: Any) -> Any:
        asked.add(name)
        return real_get(self, name, *default)

    monkeypatch.setattr(Section, "get", recording_get)
    data = yaml.safe_load(EXAMPLE.read_text())
    for m in data["models"]:
        m["path"] = str(tiny_models[m["name"]])
    from_dict(data, Path("/"))
    text = EXAMPLE.read_text()
    missing = sorted(k for k in asked if not re.search(rf"\b{k}\b\s*:", text))
    assert len(asked) > 30 and not missing, f"keys the example does not show: {missing}"


@pytest.mark.parametrize("text", ["mps: off", "mps: false", "mps: 'off'"])
def test_yaml_booleans_read_as_off(raw: dict[str, Any], text: str) -> None:
    cfg = from_dict({**raw, **yaml.safe_load(text)}, Path("/"))
    assert cfg.mps == "off"
