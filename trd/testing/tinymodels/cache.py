"""Where the built fixtures live (below the general model cache, `trd/models/cache.py`),
and their shared tokenizer, trained once per cache.

    <cache base>/tiny-models-v<BUILD_VERSION>/
      .lock          flock'ed while anything is checked or built
      tokenizer/     tokenizer.json, tokenizer_config.json, chat_template.jinja
      small/ mid/ large/ [m30/]
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from trd.models.cache import TOKENIZER_FILES, cache_base, is_complete, locked, publish
from trd.testing.tinymodels.tokenizer import save_tokenizer, train_tokenizer

# Bump whenever corpus, tokenizer, specs or training change, so that stale
# fixtures are rebuilt rather than reused.
BUILD_VERSION = 3


def cache_root(cache_dir: Path | None = None) -> Path:
    """The fixtures' folder: versioned below `cache_base`."""
    return cache_base(cache_dir) / f"tiny-models-v{BUILD_VERSION}"


def tokenizer_in(root: Path) -> Tokenizer:
    """root's tokenizer, trained and published first if missing; caller holds the lock."""
    folder = root / "tokenizer"
    if not is_complete(folder, TOKENIZER_FILES):
        publish(
            root, lambda tmp: save_tokenizer(train_tokenizer(), tmp / "tokenizer"), ["tokenizer"]
        )
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def ensure_tokenizer(cache_dir: Path | None = None) -> Tokenizer:
    """The fixture tokenizer, trained once per cache and shared by every later build."""
    root = cache_root(cache_dir)
    with locked(root):
        return tokenizer_in(root)
