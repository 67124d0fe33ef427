"""What every step shares: timestamped progress lines, JSON results, the paths used."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

START = time.monotonic()
# Where the steps find the fixtures and the shaped checkpoints (set by gpu_check.sh).
WORK = Path(os.environ.get("GPU_CHECK_WORK", "/tmp/gpu_check"))
SHAPED = {
    "small": WORK / "shaped" / "qwen3-0.6b-shaped",
    "large": WORK / "shaped" / "qwen3-8b-shaped",
}


def log(msg: str) -> None:
    """One progress line: seconds since this process started, then the message."""
    print(f"[{time.monotonic() - START:6.1f}s] {msg}", file=sys.stderr, flush=True)


def dump(path: str | Path, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=1, default=str))
