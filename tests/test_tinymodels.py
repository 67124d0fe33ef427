"""The fixture models are loadable, share a lossless tokenizer, and route like real pairs."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Literal

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from trd.models.cache import publish
from trd.testing.tinymodels import train as tr
from trd.testing.tinymodels.build import build_one, save_random_checkpoint
from trd.testing.tinymodels.cache import BUILD_VERSION, cache_root, ensure_tokenizer
from trd.testing.tinymodels.corpus import corpus

# Windows after the ones the build itself reported on, so this is a fresh sample.
HELDOUT_WINDOWS = slice(tr.EVAL_WINDOWS, 2 * tr.EVAL_WINDOWS)
# A threshold policy needs positions on both sides of it: with the 10th and
# 90th entropy percentiles closer than this, any threshold sends nearly all or
# nearly none of the positions to the large model. 0.15 of log(2048) is a factor
# of 3 in the effective number of candidate tokens.
MIN_ENTROPY_SPREAD = 0.15
Arch = Literal["qwen3", "qwen2", "llama"]  # save_random_checkpoint's architectures


@pytest.fixture(scope="module")
def heldout(tokenizer_path: Path) -> torch.Tensor:
    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    stream = tr.token_stream(tok.backend_tokenizer, corpus("heldout"))
    return tr.heldout_windows(stream, 2 * tr.EVAL_WINDOWS)[HELDOUT_WINDOWS]


def load(path: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(path).eval()


def test_models_load_with_shared_vocab_and_eos(tiny_models: dict[str, Path]) -> None:
    for name, path in tiny_models.items():
        model = load(path)
        tok = AutoTokenizer.from_pretrained(path)
        assert model.config.model_type == "qwen3", name
        assert next(model.parameters()).dtype == torch.float32, name
        assert model.config.vocab_size == len(tok) == 2048, name
        assert model.generation_config.eos_token_id == tok.eos_token_id == 0, name
    assert load(tiny_models["small"]).config.tie_word_embeddings
    assert not load(tiny_models["large"]).config.tie_word_embeddings


@pytest.mark.parametrize(
    "text",
    ["def f(x):\n    return x  # twice  spaced\n", "Grüße aus 東京 🚀, naïve café — ok\t"],
    ids=["ascii", "non-ascii"],
)
def test_tokenizer_round_trips(tokenizer_path: Path, text: str) -> None:
    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode())  # BPE merged something


def test_chat_template_is_chatml(tokenizer_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode(text)  # the markers are single special tokens, not spelled out
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 3
    assert ids.count(tok.convert_tokens_to_ids("<|im_end|>")) == 2


def test_large_predicts_heldout_text_better(
    tiny_models: dict[str, Path], heldout: torch.Tensor
) -> None:
    losses = {
        name: tr.next_token_stats(load(tiny_models[name]), heldout)[0].mean().item()
        for name in ("small", "mid", "large")
    }
    # mid and large sit within noise of each other (see SPECS); both beat small.
    assert losses["large"] < losses["small"] and losses["mid"] < losses["small"], losses


def test_small_entropy_varies_across_positions(
    tiny_models: dict[str, Path], heldout: torch.Tensor
) -> None:
    _, entropy = tr.next_token_stats(load(tiny_models["small"]), heldout)
    p10, p90 = torch.quantile(entropy, torch.tensor([0.1, 0.9])).tolist()
    assert p10 > 0.0 and p90 < 1.0
    assert p90 - p10 >= MIN_ENTROPY_SPREAD, (p10, p90)


@pytest.mark.parametrize(("arch", "tied"), [("qwen3", True), ("qwen2", False), ("llama", False)])
def test_random_checkpoint_loads(tmp_path: Path, arch: Arch, tied: bool) -> None:
    path = save_random_checkpoint(arch, tmp_path, seed=3, tie_word_embeddings=tied)
    model = load(path)
    assert model.config.model_type == arch
    assert model.config.tie_word_embeddings == tied
    attn = model.model.layers[0].self_attn
    assert (attn.q_proj.bias is not None) == (arch == "qwen2")
    assert AutoTokenizer.from_pretrained(path).decode([0]) == "<|endoftext|>"
    logits = model(input_ids=torch.tensor([[5, 6, 7, 8]])).logits
    # Wide init: next-token distributions far from uniform, so argmax is meaningful.
    assert logits.std(-1).min() > 0.5


def test_random_checkpoint_overrides_shape(tmp_path: Path) -> None:
    path = save_random_checkpoint(
        "qwen3", tmp_path, seed=0, tie_word_embeddings=False, num_hidden_layers=3, head_dim=8
    )
    config = load(path).config
    assert (config.num_hidden_layers, config.head_dim) == (3, 8)


def test_small_build_is_reproducible(tmp_path: Path) -> None:
    tok = ensure_tokenizer()
    # A few documents are plenty for three steps and keep the test cheap.
    train_ids = tr.token_stream(tok, corpus("train")[:8])
    heldout = tr.heldout_windows(tr.token_stream(tok, corpus("heldout")[:4]), 2)

    def weights(folder: str, seed: int) -> bytes:
        out = tmp_path / folder
        build_one("small", tok, train_ids, heldout, out, seed=seed, progress=False, steps=3)
        return (out / "model.safetensors").read_bytes()

    first = weights("a", seed=0)
    assert weights("b", seed=0) == first
    assert weights("c", seed=1) != first


def test_cache_root_is_absolute_whatever_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRD_CACHE_DIR", "rel/cache")
    assert cache_root() == tmp_path / "rel" / "cache" / f"tiny-models-v{BUILD_VERSION}"
    assert cache_root(Path("other")).is_absolute()


def test_a_published_folder_is_readable_by_every_user(tmp_path: Path) -> None:
    """The daemon may run as another user than the one who built its checkpoints (the
    unit's DynamicUser); safetensors and mkdtemp write owner-only modes."""

    def build(tmp: Path) -> None:
        (tmp / "model").mkdir(mode=0o700)
        (tmp / "model" / "model.safetensors").write_bytes(b"")
        (tmp / "model" / "model.safetensors").chmod(0o600)

    publish(tmp_path, build, ["model"])
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "model").rglob("*")}
    assert modes == {"model.safetensors": 0o644}
    assert stat.S_IMODE((tmp_path / "model").stat().st_mode) == 0o755
