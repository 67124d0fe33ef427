"""RoPE variants of published configs against transformers, and how their settings read.

Each variant runs on a tiny checkpoint whose original context is 16 or 32 tokens, so
the three prompts (3, 17 and 40 tokens, the longest prefilled in two chunks) and their
64 decodes run well past it, where the variant changes the frequencies. transformers
replays each sequence with a KV cache, as `generate` does; float64 within 1e-9,
float32 within 1e-4. Half the variants are written the transformers-5 way
(`rope_parameters`), half the older way (`rope_theta` + `rope_scaling` with `type`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from trd.models.checkpoint import CheckpointError, read_checkpoint
from trd.models.rope import RopeConfig, read_rope
from trd.models.rotary import dynamic_inv_frequencies, inv_frequencies
from trd.testing.tinymodels.build import save_random_checkpoint

from hf_compare import engine_runs, max_diff

PROMPTS = [[5 + i for i in range(n)] for n in (3, 17, 40)]
THETA = 10000.0
Arch = Literal["qwen3", "qwen2", "llama"]  # save_random_checkpoint's architectures
# name: (arch, rope settings, max_position_embeddings, written as old-style rope_scaling)
VARIANTS: dict[str, tuple[Arch, dict[str, Any], int, bool]] = {
    "llama3": ("llama", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
               256, False),
    "yarn": ("qwen2", {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
             32, True),  # Qwen2.5's recipe: rope_scaling added, max_position_embeddings kept
    "yarn-mscale": ("qwen3", {"rope_type": "yarn", "factor": 8.0, "mscale": 0.8,
                              "mscale_all_dim": 0.5, "beta_fast": 16,
                              "original_max_position_embeddings": 16}, 128, False),
    "linear": ("qwen3", {"rope_type": "linear", "factor": 3.0}, 256, False),
    "dynamic": ("llama", {"type": "dynamic", "factor": 4.0}, 32, True),
}  # fmt: skip


def _checkpoint(out: Path, name: str) -> Path:
    arch, rope, context, old_style = VARIANTS[name]
    path = save_random_checkpoint(arch, out, seed=5, tie_word_embeddings=False,
                                  rope_parameters={"rope_theta": THETA, **rope},
                                  max_position_embeddings=context)  # fmt: skip
    if old_style:
        cfg = json.loads((path / "config.json").read_text())
        del cfg["rope_parameters"]
        cfg |= {"rope_theta": THETA, "rope_scaling": rope}
        (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp(request.param), request.param)


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-9), ("float32", 1e-4)])
def test_variant_matches_transformers_past_the_original_context(
    variant: Path, dtype: str, tol: float
) -> None:
    rope = read_checkpoint(variant).config.rope
    assert rope.rope_type != "default" and max(map(len, PROMPTS)) > rope.original_context
    diff = max_diff(variant, dtype, engine_runs(variant, dtype, PROMPTS))
    assert diff <= tol, f"max |logit diff| {diff:.3g} > {tol}"


def test_each_variant_changes_the_frequencies(tmp_path: Path) -> None:
    """Else matching transformers would prove nothing about the variant."""
    default, _ = inv_frequencies(RopeConfig(theta=THETA), 16)
    for name in VARIANTS:
        cfg = read_checkpoint(_checkpoint(tmp_path / name, name)).config
        inv, scale = inv_frequencies(cfg.rope, cfg.head_dim)
        if cfg.rope.rope_type == "dynamic":  # default until the original context is passed
            assert torch.equal(inv, default)
            inv = dynamic_inv_frequencies(cfg.rope, 16, 33, torch.device("cpu"))
        assert not torch.allclose(inv, default), name
        assert (scale != 1.0) == name.startswith("yarn"), name


def test_served_context_follows_the_variant(tmp_path: Path) -> None:
    contexts = {n: read_checkpoint(_checkpoint(tmp_path / n, n)).config.context for n in VARIANTS}
    # dynamic: max_position_embeddings x factor; yarn: original x factor; others: as written
    assert contexts == {"llama3": 256, "yarn": 128, "yarn-mscale": 128, "linear": 256,
                        "dynamic": 128}  # fmt: skip


def test_both_spellings_read_the_same() -> None:
    new = {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                               "original_max_position_embeddings": 32}}  # fmt: skip
    old = {"rope_theta": 1e6, "rope_scaling": {"type": "yarn", "factor": 4,
                                               "original_max_position_embeddings": 32}}  # fmt: skip
    assert read_rope(new, 64, "c") == read_rope(old, 64, "c")
    assert read_rope(old, 64, "c").theta == 1e6
    # transformers: a non-empty rope_scaling wins over rope_parameters
    both = {**new, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert read_rope(both, 64, "c").rope_type == "linear"
    assert read_rope({}, 64, "c") == RopeConfig()


BAD: list[tuple[dict[str, Any], str]] = [
    ({"rope_scaling": {"type": "longrope", "factor": 4.0}},
     r"rope_scaling\.rope_type 'longrope' is not supported \(supported: default, linear"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}},
     r"rope_parameters\.high_freq_factor is missing \(rope type 'llama3'\)"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0, "mrope_section": [8, 8]}},
     r"rope_scaling\.mrope_section is not supported for rope type 'dynamic'"),
    ({"rope_scaling": {"type": "linear", "factor": 0.5}},
     r"rope_scaling\.factor has unexpected value 0\.5 \(expected >= 1\)"),
    ({"partial_rotary_factor": 0.5}, r"partial_rotary_factor 0\.5 is not supported"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default"}}},
     r"rope_parameters\.full_attention: per-layer-type rope settings are not supported"),
]  # fmt: skip


@pytest.mark.parametrize("cfg,error", BAD, ids=[e.split("\\")[0] for _, e in BAD])
def test_unsupported_settings_are_refused_by_key(cfg: dict[str, Any], error: str) -> None:
    with pytest.raises(CheckpointError, match=rf"^config\.json: {error}"):
        read_rope(cfg, 64, "config.json")
