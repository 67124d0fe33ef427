"""The pair and prompt source of the router commands' command lines (`tokenrouterd
train-router`, `tokenrouterd eval routing`): `--pair NAME`, or `--small/--large` folders
(either overrides the pair's)."""

from __future__ import annotations

import argparse

from trd.demo.pair import ensure_demo_pair


def resolve_pair(
    ap: argparse.ArgumentParser, args: argparse.Namespace, *, train: bool = False
) -> argparse.Namespace:
    """Fill args.small / args.large from --pair (built or imported into the cache first if
    missing) and args.prompts by the pair's default (for training the demo pair of code
    models: the project's written code tasks)."""
    if args.pair:
        pair = ensure_demo_pair("tiny") if args.pair == "tiny" else ensure_demo_pair()
        found = pair.models
        args.small, args.large = args.small or found["small"], args.large or found["large"]
    if not (args.small and args.large):
        ap.error("give --pair, or --small and --large")
    default = {"tiny": "corpus", "demo": "code" if train else "chat"}.get(args.pair, "chat")
    args.prompts = args.prompts or default
    return args
