"""The demo's small model: the large model's first layers, distilled on its own chats.

    <cache>/demo-partner-v<PARTNER_VERSION>/
      .lock
      <fingerprint of the large model>/   config.json  model.safetensors
                                          generation_config.json + the large's tokenizer files

The partner keeps the large model's tied embedding (which is also its output layer,
so both models share the vocabulary and the geometry of the final hidden state), its
final norm and its first LAYERS layers, then trains those layers to match the large
model's next-token distributions on conversations the large model wrote itself
(`teacher.converse`). Everything is local, seeded and on CPU; the full build takes
about 8 minutes on two cores. `scripts/demo_quality.py` reports its held-out agreement
with the large model and its step cost.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import LlamaConfig, LlamaForCausalLM

from trd.demo import distil, teacher
from trd.models.checkpoint import read_checkpoint
from trd.testing.tinymodels.build import torch_threads
from trd.testing.tinymodels.cache import cache_base, is_complete, locked, publish

# Bump whenever the recipe below changes, so that stale partners are rebuilt.
PARTNER_VERSION = 2
LAYERS = 2
# Copied from the large model byte for byte: both models must tokenize identically.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)
PARTNER_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
# Generation on two one-thread processes; training on two threads (fixed, not the
# host's count, so that the weights do not depend on the machine's core count).
WORKERS = 2
TRAIN_THREADS = 2


@dataclass(frozen=True, slots=True)
class Budget:
    """How much teacher data and training a build gets."""

    conversations: int
    max_question: int
    max_answer: int
    steps: int
    batch: int
    lr: float


FULL = Budget(conversations=480, max_question=64, max_answer=128, steps=360, batch=8, lr=2e-3)


def log(msg: str) -> None:
    print(f"partner: {msg}", file=sys.stderr, flush=True)


def slice_of(large_dir: Path, layers: int) -> LlamaForCausalLM:
    """A Llama model with the large's embedding, final norm and first `layers` layers."""
    cfg = json.loads((large_dir / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    cfg.pop("architectures", None)
    config = LlamaConfig(**cfg)
    model = LlamaForCausalLM(config)  # not on "meta": the rope buffers must be real
    wanted = set(model.state_dict())
    weights: dict[str, torch.Tensor] = {}
    for path in read_checkpoint(large_dir).weight_files:
        with safe_open(path, framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if key in wanted:
                    weights[key] = f.get_tensor(key).float()
    if config.tie_word_embeddings:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    missing = sorted(wanted - set(weights))
    if missing:
        raise ValueError(f"{large_dir}: weights missing for a {layers}-layer slice: {missing[:5]}")
    model.load_state_dict(weights, assign=True)
    model.tie_weights()
    return model.float()


def build_partner(
    large_dir: Path, out: Path, budget: Budget = FULL, *, seed: int = 0, progress: bool = True
) -> Path:
    """Build the partner of the checkpoint in large_dir into out (created)."""
    large_dir = Path(large_dir)
    start = time.perf_counter()
    pad_id = read_checkpoint(large_dir).config.eos_token_ids[0]
    examples = teacher.converse_parallel(
        large_dir,
        budget.conversations,
        seed=seed,
        workers=WORKERS,
        max_question=budget.max_question,
        max_answer=budget.max_answer,
        progress=progress,
    )
    labelled = sum(len(ex.top_ids) for ex in examples)
    seconds = time.perf_counter() - start
    log(f"{len(examples)} conversations, {labelled} labelled tokens, {seconds:.0f} s")
    with torch_threads(TRAIN_THREADS):
        torch.manual_seed(seed)
        model = slice_of(large_dir, LAYERS)
        losses = distil.distil(
            model,
            examples,
            steps=budget.steps,
            batch=budget.batch,
            lr=budget.lr,
            seed=seed,
            pad_id=pad_id,
            progress=progress,
        )
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (large_dir / name).is_file():
            shutil.copyfile(large_dir / name, out / name)
    tail = losses[-max(1, len(losses) // 10) :]
    log(f"built in {time.perf_counter() - start:.0f} s, final KL {sum(tail) / len(tail):.3f} nats")
    return out


def fingerprint(large_dir: Path) -> str:
    """A short digest of the large model's config, tokenizer and tensor layout.

    Reading the weights themselves would cost seconds on every call; the safetensors
    headers (names, shapes, dtypes, offsets) and file sizes tell apart every model
    the demo can be given.
    """
    h = hashlib.sha256()
    for name in ("config.json", "tokenizer.json"):
        h.update((large_dir / name).read_bytes())
    for path in read_checkpoint(large_dir).weight_files:
        with open(path, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            h.update(fh.read(size))
        h.update(str(path.stat().st_size).encode())
    return h.hexdigest()[:16]


def ensure_partner(large_dir: Path, cache_dir: Path | None = None) -> Path:
    """The partner of large_dir from the cache, built there once (under a lock) if missing."""
    large_dir = Path(large_dir).absolute()
    root = cache_base(cache_dir) / f"demo-partner-v{PARTNER_VERSION}"
    name = fingerprint(large_dir)
    with locked(root):
        if not is_complete(root / name, PARTNER_FILES):
            log(f"building the partner of {large_dir} into {root / name} (a few minutes)")
            publish(root, lambda tmp: build_partner(large_dir, tmp / name), [name])
    return root / name
