"""Build the fixture models into a folder and print what they measure on held-out text.

python -m trd.testing.tinymodels OUT_DIR [--names small,mid,large,m30] [--seed 0]

(The tests build them into the cache by themselves: `build.ensure_models`.)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from trd.testing.tinymodels.build import SPECS, build_all
from trd.testing.tinymodels.tokenizer import save_tokenizer, train_tokenizer


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trd.testing.tinymodels",
        description="Train the tiny routing fixture models (shared byte-level BPE tokenizer, "
        "Qwen3 architecture) on the standard library's docstrings and save each as a "
        "Hugging Face folder OUT_DIR/<name>/.",
    )
    parser.add_argument("out_dir", type=Path, help="folder to create the model folders in")
    parser.add_argument(
        "--names",
        default="small,mid,large",
        help=f"comma-separated models to build, from {','.join(SPECS)} (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="training seed (default: %(default)s)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    names = [n for n in args.names.split(",") if n]
    start = time.perf_counter()
    tok = train_tokenizer()
    save_tokenizer(tok, args.out_dir / "tokenizer")
    print(f"tokenizer: {time.perf_counter() - start:.1f} s")
    built = build_all(args.out_dir, names, tok, seed=args.seed, progress=True)
    print(f"{'model':<6} {'params':>10} {'loss':>6} {'H p10':>6} {'H p50':>6} {'H p90':>6}   build")
    for name, b in built.items():
        e = b.heldout
        print(
            f"{name:<6} {b.params:>10,} {e.loss:>6.3f} {e.entropy_p10:>6.3f} "
            f"{e.entropy_p50:>6.3f} {e.entropy_p90:>6.3f} {b.seconds:>7.1f}s"
        )


if __name__ == "__main__":
    main()
