"""Routed models must share a tokenizer (same ids for the same strings), not a vocab size.

Copies of the fixture large model with one thing changed in tokenizer.json: the config
refuses each at load, naming `models[1].path` and the first difference; a copy whose
embedding matrix is merely padded is accepted. `tokenrouterd --check` exits 2.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from trd.config import ConfigError, from_dict
from trd.daemon import EXIT_CONFIG, Daemon
from trd.daemon import main as daemon_main
from trd.frontend.auth import Access
from trd.models.checkpoint import CheckpointError, read_checkpoint
from trd.models.tokenizers import TokenizerFile, first_difference, read_tokenizer
from trd.supervisor.deployment import plan_deployment

Edit = Callable[[dict[str, Any]], None]


def _swap_ids(tok: dict[str, Any]) -> None:
    vocab = tok["model"]["vocab"]
    vocab["#"], vocab["%"] = vocab["%"], vocab["#"]


def _merge(tok: dict[str, Any]) -> None:
    tok["model"]["merges"][312] = ["Ġcom", "e"]


def _added_id(tok: dict[str, Any]) -> None:
    tok["added_tokens"][2]["id"] = 2047


def _added_gone(tok: dict[str, Any]) -> None:
    tok["added_tokens"][2]["content"] = "<|end|>"


def _pre_tokenizer(tok: dict[str, Any]) -> None:
    tok["pre_tokenizer"]["add_prefix_space"] = True


def _byte_fallback(tok: dict[str, Any]) -> None:
    tok["model"]["byte_fallback"] = True


EDITS: list[tuple[Edit, str]] = [
    (_swap_ids, "token '#' is id 5 in small, id 7 in large"),
    (_merge, "merge #312 differs: 'Ġcom m' in small, 'Ġcom e' in large"),
    (_added_id, "added token '<|im_end|>': id 2 vs 2047 (small vs large)"),
    (_added_gone, "added token '<|im_end|>': id 2 in small, absent in large"),
    (_pre_tokenizer, 'pre_tokenizer differs: {"add_prefix_space": false, "trim_offsets"'),
    (_byte_fallback, "tokenizer model byte_fallback: False in small, True in large"),
]


def _copy(src: Path, dst: Path, edit: Edit | None = None, **config: Any) -> Path:
    shutil.copytree(src, dst)
    if edit is not None:
        tok = json.loads((dst / "tokenizer.json").read_text())
        edit(tok)
        (dst / "tokenizer.json").write_text(json.dumps(tok))
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**cfg, **config}))
    return dst


def _raw(small: Path, large: Path) -> dict[str, Any]:
    return {"device": "cpu", "models": [{"name": "small", "path": str(small)},
                                        {"name": "large", "path": str(large)}]}  # fmt: skip


@pytest.mark.parametrize("edit,difference", EDITS, ids=[e.__name__[1:] for e, _ in EDITS])
def test_a_different_tokenizer_is_refused_with_its_first_difference(
    tiny_models: dict[str, Path], tmp_path: Path, edit: Edit, difference: str
) -> None:
    large = _copy(tiny_models["large"], tmp_path / "large", edit)
    with pytest.raises(ConfigError) as err:
        from_dict(_raw(tiny_models["small"], large), Path("/"))
    msg = str(err.value)
    assert msg.startswith(f"models[1].path: '{large}': its tokenizer differs from small's: ")
    assert difference in msg, msg


def test_only_the_first_difference_is_named() -> None:
    base = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2}, "merges": ["a b"]},
            "added_tokens": [], "decoder": {"type": "ByteLevel"}}  # fmt: skip
    other = json.loads(json.dumps(base))
    other["model"]["vocab"] = {"a": 0, "c": 1, "b": 2}
    other["model"]["merges"] = ["a c"]
    other["decoder"] = None
    a, b = TokenizerFile(Path("a"), base), TokenizerFile(Path("b"), other)
    assert first_difference(a, b, "A", "B") == "token 'b' is id 1 in A, id 2 in B"
    assert first_difference(a, a, "A", "A") is None
    # Fields the daemon never uses are not compared.
    padded = TokenizerFile(Path("c"), {**base, "padding": {"length": 8}, "version": "9"})
    assert first_difference(a, padded, "A", "C") is None


def test_padded_embeddings_share_the_tokenizer(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    small = _copy(tiny_models["small"], tmp_path / "small", vocab_size=2048 + 64)
    cfg = from_dict(_raw(small, tiny_models["large"]), Path("/"))
    # Both models local: a missing checkpoint would shorten the list.
    ckpts = [m.checkpoint for m in cfg.models if m.checkpoint is not None]
    assert [c.config.vocab_size for c in ckpts] == [2112, 2048]
    assert [c.vocab_limit for c in ckpts] == [2048, 2048]
    # The front end's token-id checks use the tokenizer's ids, not the entry's rows.
    assert Daemon(cfg, plan_deployment(cfg), None, Access.of(cfg, {}))._served().vocab_size == 2048


def test_vocab_limit_counts_added_tokens_and_must_fit_the_embeddings(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    def think(tok: dict[str, Any]) -> None:
        tok["added_tokens"].append({**tok["added_tokens"][0], "id": 2050, "content": "<think>"})

    padded = _copy(tiny_models["large"], tmp_path / "padded", think, vocab_size=2112)
    tok = read_tokenizer(padded)
    assert tok is not None and tok.vocab_limit == 2051  # vocab 0..2047, <think> 2050
    assert read_checkpoint(padded).vocab_limit == 2051
    short = _copy(tiny_models["large"], tmp_path / "short", think)
    with pytest.raises(CheckpointError, match=r"token ids reach 2050, but config\.json's "
                                              r"vocab_size is 2048"):  # fmt: skip
        read_checkpoint(short)


def test_a_routed_model_without_tokenizer_json_is_refused(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    large = _copy(tiny_models["large"], tmp_path / "large")
    (large / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match=r"models\[1\]\.path: .*no tokenizer\.json: cannot check"):
        from_dict(_raw(tiny_models["small"], large), Path("/"))


def test_a_different_chat_template_is_a_warning(
    tiny_models: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    large = _copy(tiny_models["large"], tmp_path / "large")
    (large / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    with caplog.at_level(logging.WARNING, logger="trd.config"):
        from_dict(_raw(tiny_models["small"], large), Path("/"))
    assert "models[1] (large): its chat template differs from small's" in caplog.text


def test_check_exits_2_naming_the_difference(
    tiny_models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    large = _copy(tiny_models["large"], tmp_path / "large", _swap_ids)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_raw(tiny_models["small"], large)))
    assert daemon_main(["--check", "--config", str(config)]) == EXIT_CONFIG == 2
    err = capsys.readouterr().err
    assert "models[1].path" in err and "token '#' is id 5 in small, id 7 in large" in err
