"""One config, two hosts: what each reads and plans, and the model card's checks.

The daemon's host has the small model only (the large one's path does not exist there);
the remote host has the large one only. Each plans its own engines; the daemon checks
the remote's tokenizer, context and config when it connects (trd/remote/card.py).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest

from trd.config import Address, ConfigError, from_dict
from trd.daemon import EXIT_CONFIG
from trd.daemon import main as daemon_main
from trd.engines.spec import EngineSpec
from trd.protocol import Ready
from trd.remote.card import CardError, check_card, model_card
from trd.remote.spec import RemoteSpec
from trd.supervisor.deployment import plan_deployment

TOKEN = "a-shared-token-0123456789"


@pytest.fixture
def hosts(tiny_models: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    """The daemon's host has only `small`, the remote host only `large`."""
    out = {}
    for name in ("small", "large"):
        out[name] = tmp_path / name
        shutil.copytree(tiny_models[name], out[name])
    return out


def raw_config(small: Path, large: Path, **extra: Any) -> dict[str, Any]:
    return {
        "device": "cpu",
        "models": [
            {"name": "small", "path": str(small), "dtype": "float32"},
            {"name": "large", "path": str(large), "dtype": "float32", "remote": "10.0.0.2:7070"},
        ],
        "remote_token": TOKEN,
        "policy": {"name": "scripted", "schedule": [0, 1]},
        **extra,
    }


def test_each_host_reads_and_plans_only_its_own_models(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    missing = tmp_path / "not-on-this-host"
    daemon = from_dict(raw_config(hosts["small"], missing), Path("/"))
    assert [m.checkpoint is not None for m in daemon.models] == [True, False]
    assert daemon.models[1].remote == Address("10.0.0.2", 7070)
    dep = plan_deployment(daemon)
    assert [m.name for m in dep.plan.models] == ["small"]
    small, large = dep.specs
    assert isinstance(small, EngineSpec) and small.num_models == 2
    assert isinstance(large, RemoteSpec) and (large.index, large.address.port) == (1, 7070)
    assert large.model_names == ("small", "large") and large.entry_dir == hosts["small"]
    assert TOKEN not in repr(large), "the token must stay out of log lines"

    remote = from_dict(raw_config(missing, hosts["large"]), Path("/"), serve="large")
    assert [m.checkpoint is not None for m in remote.models] == [False, True]
    dep = plan_deployment(remote)
    assert [m.name for m in dep.plan.models] == ["large"]
    [engine] = [s for s in dep.specs if isinstance(s, EngineSpec)]
    assert (engine.index, engine.num_models, engine.name) == (1, 2, "large")
    assert remote.threads() == daemon.threads()  # one local engine on each host


@pytest.mark.parametrize(
    ("change", "serve", "message"),
    [
        ({"models.0.remote": "10.0.0.3:7070"}, None, "models[0].remote: '10.0.0.3:7070': the "
         "entry model runs with the daemon"),
        ({"remote_token": None}, None, "remote_token: missing: model 'large' is remote"),
        ({"remote_token": None}, "large", "remote_token: missing: this host serves 'large'"),
        ({"remote_token": "short"}, None, "remote_token: '<hidden>': expected a printable"),
        ({"models.1.remote": "10.0.0.2"}, None, "models[1].remote: '10.0.0.2': expected"),
        ({"models.1.remote": "10.0.0.2:0"}, None, "models[1].remote: '10.0.0.2:0': expected "
         "'host:port' with a port in 1..65535"),  # the daemon must know the remote's port
        ({}, "mid", "--model: 'mid': no such model in the config"),
    ],
)  # fmt: skip
def test_bad_remote_settings_name_the_key(
    hosts: dict[str, Path], change: dict[str, Any], serve: str | None, message: str
) -> None:
    raw = raw_config(hosts["small"], hosts["large"])
    for key, value in change.items():
        *path, last = key.split(".")
        node: Any = raw
        for part in path:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is None:
            del node[last]
        else:
            node[last] = value
    with pytest.raises(ConfigError) as exc:
        from_dict(raw, Path("/"), serve=serve)
    assert message in str(exc.value)


def test_check_names_the_remote_model_and_engine_help_helps(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw_config(hosts["small"], tmp_path / "elsewhere")))
    assert daemon_main(["--check", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "model 'large' runs at 10.0.0.2:7070: its host plans its own memory" in out
    with pytest.raises(SystemExit) as exit_:
        daemon_main(["engine", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--config", "--model", "--listen", "remote_token"):
        assert flag in out
    assert daemon_main(["engine", "--config", str(path), "--model", "large",
                        "--listen", "0.0.0.0:7070"]) == EXIT_CONFIG  # fmt: skip
    assert "not a servable checkpoint" in capsys.readouterr().err  # large is not on this host


# -- the model card ------------------------------------------------------------------------
@pytest.fixture
def card_pair(hosts: dict[str, Path]) -> tuple[dict[str, Any], RemoteSpec]:
    """The card the remote host would send, and the daemon's view of that engine."""
    raw = raw_config(hosts["small"], hosts["large"], max_model_len=1024)
    remote_cfg = from_dict(raw, Path("/"), serve="large")
    [engine] = [s for s in plan_deployment(remote_cfg).specs if isinstance(s, EngineSpec)]
    card = model_card(engine, ["small", "large"], Ready(1, 4321, 64, 16))
    daemon_cfg = from_dict({**raw, "models": copy.deepcopy(raw["models"])}, Path("/"))
    spec = plan_deployment(daemon_cfg).specs[1]
    assert isinstance(spec, RemoteSpec)
    return card, spec


def test_a_matching_card_gives_the_engines_ready(
    card_pair: tuple[dict[str, Any], RemoteSpec],
) -> None:
    card, spec = card_pair
    assert check_card(card, spec) == Ready(1, 4321, 64, 16)
    assert card["vocab_limit"] == 2048 and card["context"] == 1024


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"models": ["large", "small"]}, "both hosts need the same models, in the same order"),
        ({"index": 0}, "both hosts need the same models"),
        ({"policy": "rstitch"}, "it routes with policy 'rstitch', this daemon with 'scripted'"),
        ({"context": 100}, "at most 100 tokens, max_model_len is 1024: set max_model_len to at "
         "most 100"),
        ({"tokenizer": None}, "its checkpoint has no tokenizer.json"),
        ({"pid": "x"}, "no integer 'pid'"),
    ],
)  # fmt: skip
def test_a_card_that_is_not_ours_is_refused_with_the_reason(
    card_pair: tuple[dict[str, Any], RemoteSpec], edit: dict[str, Any], message: str
) -> None:
    card, spec = card_pair
    with pytest.raises(CardError) as exc:
        check_card({**card, **edit}, spec)
    assert message in str(exc.value)


def test_a_remote_tokenizer_that_differs_is_named(
    card_pair: tuple[dict[str, Any], RemoteSpec],
) -> None:
    card, spec = card_pair
    tok = copy.deepcopy(card["tokenizer"])
    vocab = tok["model"]["vocab"]
    first = min(vocab, key=vocab.get)
    vocab["<swapped>"] = vocab.pop(first)
    with pytest.raises(CardError) as exc:
        check_card({**card, "tokenizer": tok}, spec)
    assert f"its tokenizer differs from small's: token {first!r} is id" in str(exc.value)
