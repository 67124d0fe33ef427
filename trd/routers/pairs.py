"""The pair and prompt source of the router scripts' command lines (train_router.py,
eval_routing.py): `--pair NAME`, or `--small/--large` folders (either overrides the pair's)."""

from __future__ import annotations

import argparse

from benchkit.pairs import load_pair


def resolve_pair(
    ap: argparse.ArgumentParser, args: argparse.Namespace, *, train: bool = False
) -> argparse.Namespace:
    """Fill args.small / args.large from --pair and args.prompts by the pair's default
    (for training the demo pair: the questions its large model writes)."""
    if args.pair:
        found = load_pair(args.pair).models
        args.small, args.large = args.small or found["small"], args.large or found["large"]
    if not (args.small and args.large):
        ap.error("give --pair, or --small and --large")
    default = {"tiny": "corpus", "demo": "magpie" if train else "chat"}.get(args.pair, "chat")
    args.prompts = args.prompts or default
    return args
