"""Build the fixture models: named Qwen3 configs, trained briefly, saved as HF folders.

    out_dir/
      small/  config.json  generation_config.json  model.safetensors
              tokenizer.json  tokenizer_config.json  chat_template.jinja
      mid/ ...
      large/ ...

Every folder is a complete checkpoint the engine can serve, and every model
shares one tokenizer, as models routed within one response must.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Tokenizer
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from trd.models.cache import MODEL_FILES, is_complete, locked, publish
from trd.testing.tinymodels import train as tr
from trd.testing.tinymodels.cache import cache_root, ensure_tokenizer, tokenizer_in
from trd.testing.tinymodels.corpus import corpus
from trd.testing.tinymodels.tokenizer import EOS_ID, VOCAB_SIZE, save_tokenizer, train_tokenizer

# One thread: on a shared two-core machine two OpenMP threads spin against
# other processes and train up to ten times slower; one thread also makes the
# weights independent of the host's core count.
TRAIN_THREADS = 1
# Weights of random checkpoints: wider than the usual 0.02 so that logits are
# far from uniform and equivalence tests compare distinct tokens.
RANDOM_INIT_STD = 0.1


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of one fixture model and how long it trains."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    steps: int
    batch: int
    lr: float

    @property
    def cost(self) -> int:
        """Rough training cost: parameters touched per token times steps times batch."""
        per_layer = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        per_layer += self.heads * self.head_dim * self.hidden + 3 * self.hidden * self.intermediate
        return (self.layers * per_layer + self.hidden * VOCAB_SIZE) * self.steps * self.batch

    def config(self) -> Qwen3Config:
        return Qwen3Config(
            **_common_config(self.tied),
            hidden_size=self.hidden,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate,
        )


# One width, depth 1/2/6. A decode step of models this small is overhead-bound
# (on CPU and on a GPU alike: about one kernel sequence per layer), so depth sets
# the step cost: large costs about 4x the small's step. The small model ties its
# embeddings, which costs it most of its quality at this size; mid and large are
# untied and sit within ~0.1 nats of each other after 200 steps (more depth needs
# more steps than the budget of about a minute and a half on one core allows).
# m30 is for benchmarks that need a genuinely heavier step; it trains only a few
# steps and stays near the unigram loss.
SPECS: dict[str, ModelSpec] = {
    "small": ModelSpec(64, 1, 2, 1, 32, 192, True, steps=200, batch=16, lr=5e-3),
    "mid": ModelSpec(64, 2, 2, 1, 32, 192, False, steps=200, batch=16, lr=5e-3),
    "large": ModelSpec(64, 6, 2, 1, 32, 192, False, steps=200, batch=16, lr=1e-2),
    "m30": ModelSpec(512, 10, 8, 4, 64, 1536, False, steps=6, batch=16, lr=1e-3),
}


@dataclass(frozen=True, slots=True)
class BuiltModel:
    """Where a model was saved and what it measured on held-out text."""

    path: Path
    params: int
    heldout: tr.Evaluation
    seconds: float


def _common_config(tied: bool) -> dict[str, Any]:
    return {
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "tie_word_embeddings": tied,
        "eos_token_id": EOS_ID,
        "pad_token_id": EOS_ID,
        "bos_token_id": None,
        "dtype": "float32",
    }


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to n inside the block, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _save(model: PreTrainedModel, tok: Tokenizer, out: Path) -> Path:
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=EOS_ID, pad_token_id=EOS_ID).save_pretrained(out)
    save_tokenizer(tok, out)
    return out


def build_one(
    name: str,
    tok: Tokenizer,
    train_ids: torch.Tensor,
    heldout: torch.Tensor,
    out: Path,
    *,
    seed: int,
    progress: bool,
    steps: int | None = None,
) -> BuiltModel:
    """Train SPECS[name] (or for `steps` steps) from seed and save it to out."""
    spec = SPECS[name]
    start = time.perf_counter()
    with torch_threads(TRAIN_THREADS):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(spec.config()).float()
        tr.train(
            model,
            train_ids,
            steps=spec.steps if steps is None else steps,
            batch=spec.batch,
            lr=spec.lr,
            seed=seed,
            progress=name if progress else None,
        )
        evaluation = tr.evaluate(model, heldout)
    params = sum(p.numel() for p in model.parameters())
    _save(model, tok, out)
    return BuiltModel(out, params, evaluation, time.perf_counter() - start)


def build_all(
    out_dir: Path,
    names: Sequence[str],
    tok: Tokenizer,
    *,
    seed: int,
    progress: bool,
) -> dict[str, BuiltModel]:
    """Each named model into out_dir/<name>/, with its held-out statistics."""
    unknown = sorted(set(names) - SPECS.keys())
    if unknown:
        raise ValueError(f"unknown model names {unknown}; known: {sorted(SPECS)}")
    train_ids = tr.token_stream(tok, corpus("train"))
    heldout = tr.heldout_windows(tr.token_stream(tok, corpus("heldout")))
    # Training runs on one thread (reproducible weights), so train the models side by
    # side, one process per core.
    workers = min(len(names), os.cpu_count() or 1)
    ctx = mp.get_context("spawn")
    args = (tok.to_str(), train_ids, heldout, seed, progress)
    # Costliest first, so the longest build never starts last.
    order = sorted(names, key=lambda n: -SPECS[n].cost)
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = {n: pool.submit(_build_in_worker, n, out_dir / n, *args) for n in order}
        return {name: futures[name].result() for name in names}


def _build_in_worker(
    name: str,
    out: Path,
    tok_json: str,
    train_ids: torch.Tensor,
    heldout: torch.Tensor,
    seed: int,
    progress: bool,
) -> BuiltModel:
    tok = Tokenizer.from_str(tok_json)
    return build_one(name, tok, train_ids, heldout, out, seed=seed, progress=progress)


def build_models(
    out_dir: Path,
    names: Sequence[str] = ("small", "mid", "large"),
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Path]:
    """Build the named fixture models into out_dir/<name>/; returns {name: folder}."""
    built = build_all(out_dir, names, train_tokenizer(), seed=seed, progress=progress)
    return {name: b.path for name, b in built.items()}


def ensure_models(
    cache_dir: Path | None = None, names: Sequence[str] = ("small", "mid", "large")
) -> dict[str, Path]:
    """The named models from the cache (see `cache_root`), built there once if missing.

    Safe when several processes (pytest workers, engines) ask at once: the
    first builds under the lock, the others wait and then reuse its folders.
    """
    root = cache_root(cache_dir)
    with locked(root):
        missing = [n for n in names if not is_complete(root / n, MODEL_FILES)]
        if missing:
            tok = tokenizer_in(root)
            publish(root, lambda tmp: build_all(tmp, missing, tok, seed=0, progress=True), missing)
    return {name: root / name for name in names}


def save_random_checkpoint(
    arch: Literal["qwen3", "qwen2", "llama"],
    out_dir: Path,
    seed: int,
    *,
    tie_word_embeddings: bool,
    **overrides: Any,
) -> Path:
    """A tiny randomly initialised checkpoint of arch in out_dir, with the fixture tokenizer.

    overrides replace config fields (e.g. num_hidden_layers=3).
    """
    fields: dict[str, Any] = {
        **_common_config(tie_word_embeddings),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "initializer_range": RANDOM_INIT_STD,
    }
    config: PretrainedConfig
    if arch == "qwen3":
        config = Qwen3Config(**{"head_dim": 16, **fields, **overrides})
        model_cls: type[PreTrainedModel] = Qwen3ForCausalLM
    elif arch == "qwen2":
        config = Qwen2Config(**{**fields, **overrides})  # q/k/v projections carry biases
        model_cls = Qwen2ForCausalLM
    else:
        config = LlamaConfig(**{"attention_bias": False, **fields, **overrides})
        model_cls = LlamaForCausalLM
    torch.manual_seed(seed)
    model = model_cls(config).float()
    return _save(model, ensure_tokenizer(), out_dir)
