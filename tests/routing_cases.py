"""Shared workload and policy settings for the routing tests (float64 throughout)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from trd.engines.spec import EngineSpec
from trd.policies.heads import save_random_head
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.supervisor.group import EngineGroup
from trd.testing.reference import ReferenceRouter, Trace
from trd.testing.tinymodels.corpus import corpus
from trd.testing.wiring import Wiring

MODEL_SETS = {2: ("small", "large"), 3: ("small", "mid", "large")}
# GlimpRouter on the fixtures: their top-20 entropies lie near ln 20, steps end by length
# (the fixture tokenizer has no "\n\n" token and the models rarely write "\n" twice),
# and " list" stands for </think>, so answers handed to the large model occur too.
GLIMP = {"threshold": 2.8, "step_tokens": 6, "think_end": " list"}
Job = tuple[list[int], SamplingParams]
Case = tuple[str, dict[str, Any], int]  # policy, its parameters, how many models
# The policies wired in one process (test_routing_inprocess, test_grammar_routing).
INPROCESS_CASES: list[Case] = [
    ("rstitch", {"threshold": 0.78}, 2),
    ("scripted", {"schedule": [1, 0, 0, 1, 1, 0]}, 2),
    ("ensemble", {"weights": [0.6, 0.4], "seed": 1}, 2),
    ("rstitch", {"threshold": 0.78}, 3),
    ("scripted", {"schedule": [2, 0, 1, 1, 0, 2, 2]}, 3),
    ("ensemble", {"weights": [0.5, 0.2, 0.3], "seed": 3}, 3),
    ("glimp", GLIMP, 2),
]


def random_heads(folder: Path, small: Path) -> dict[str, Path]:
    """Seeded, untrained router heads for the learned gates on the fixtures' small model
    (the `heads` fixture)."""
    hidden = json.loads((small / "config.json").read_text())["hidden_size"]
    return {
        # citer reads the logits' features too (top 6 log-probabilities + 2 entropies)
        "citer": save_random_head(folder / "citer.safetensors", "citer", hidden + 8, 32, 1, 6),
        "r2r": save_random_head(folder / "r2r.safetensors", "r2r", 2 * hidden + 8, 32, 2, 8),
        "collm": save_random_head(folder / "collm.safetensors", "collm", hidden, 0, 3),
    }


def process_cases(heads: dict[str, Path]) -> list[Case]:
    """Every policy over engine processes (test_routing_processes), heads from `heads`."""
    return [
        ("rstitch", {"threshold": 0.78}, 2),
        ("rstitch", {"threshold": 0.78}, 3),
        ("citer", {"head": str(heads["citer"]), "threshold": 0.5}, 2),
        ("r2r", {"head": str(heads["r2r"]), "threshold": 0.5}, 2),
        ("collm", {"head": str(heads["collm"]), "threshold": 0.5}, 2),
        ("glimp", GLIMP, 2),
        ("ensemble", {"weights": [0.5, 0.2, 0.3], "seed": 3}, 3),
        ("scripted", {"schedule": [2, 0, 1, 1, 0, 2, 2]}, 3),
    ]


def prompts(tokenizer_dir: Path, count: int) -> list[list[int]]:
    """Held-out text cut into prompts of 4..60 tokens."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    docs = corpus("heldout")
    out = []
    for i in range(count):
        ids = tok.encode(docs[i % len(docs)]).ids
        out.append(ids[: 4 + (i * 7) % 57] or [1])
    return out


def jobs(tokenizer_dir: Path, count: int = 32) -> list[Job]:
    """Outputs of 16..256 tokens; some stop at EOS, some sample with a seed."""
    out = []
    for i, prompt in enumerate(prompts(tokenizer_dir, count)):
        max_tokens = 256 if i == 0 else (16, 24, 32, 48)[i % 4]
        sampled = i % 5 == 3
        params = SamplingParams(
            max_tokens=max_tokens,
            ignore_eos=i % 3 != 0,
            temperature=0.8 if sampled else 0.0,
            top_p=0.9 if sampled else 1.0,
            seed=1000 + i if sampled else None,
        )
        out.append((prompt, params))
    return out


def shared_prefix_jobs(tokenizer_dir: Path, count: int = 8) -> list[Job]:
    """Prompts that share long prefixes, as chats with one system prompt and agent turns
    do: a 40-token head common to all, one of two 24-token middles, a tail of 1..6 tokens
    of its own (so whole 16-token blocks are shared and the last is partial); outputs of
    12..20 tokens, greedy except one seeded sample."""
    text = [p for p in prompts(tokenizer_dir, 64) if len(p) >= 40]
    head, middles = text[0][:40], [text[1][:24], text[2][:24]]
    out = []
    for i in range(count):
        tail = text[3 + i][: 1 + i % 6]
        sampled = i % 4 == 3
        params = SamplingParams(
            max_tokens=12 + 4 * (i % 3),
            ignore_eos=True,
            temperature=0.8 if sampled else 0.0,
            seed=2000 + i if sampled else None,
        )
        out.append(([*head, *middles[i % 2], *tail], params))
    return out


def specs(
    paths: list[Path], policy: str, params: dict[str, Any], kv_tokens: int = 16384, **settings: Any
) -> list[EngineSpec]:
    """float64 engine specs for `paths` routed by `policy`, built as the daemon builds them."""
    settings = {"max_batch_tokens": 512, **settings}
    return [
        dataclasses.replace(
            EngineSpec.of(
                p,
                index=i,
                num_models=len(paths),
                policy=PolicySpec(policy, params),
                dtype="float64",
                kv_tokens=kv_tokens,
                **settings,
            ),
            # One thread each, both cores for a forward while the peers are idle
            # (`ThreadShare`): what the daemon's auto setting gives on 2 cores.
            threads_alone=2,
            host_peers=tuple(j for j in range(len(paths)) if j != i),
        )
        for i, p in enumerate(paths)
    ]


def wired(
    paths: list[Path],
    policy: str,
    params: dict[str, Any],
    seed: int | None,
    max_model_len: int = 0,
    **settings: Any,
) -> Wiring:
    """Engines of `specs` wired in one process, interleavings and duplicates by `seed`
    (None: each engine in turn, nothing duplicated)."""
    base = {"kv_tokens": 8192, "max_batch_tokens": 256, "max_model_len": max_model_len}
    return Wiring(specs(paths, policy, params, **{**base, **settings}), seed)


_TRACES: dict[str, list[Trace]] = {}


def reference(
    paths: list[Path], policy: str, params: dict[str, Any], work: list[Job]
) -> list[Trace]:
    """Reference-loop traces for a workload, computed once per test session."""
    key = json.dumps([[str(p) for p in paths], policy, params, [[p, repr(sp)] for p, sp in work]])
    if key not in _TRACES:
        ref = ReferenceRouter(paths, PolicySpec(policy, params))
        _TRACES[key] = [ref.run(p, sp) for p, sp in work]
    return _TRACES[key]


def fresh_stats(group: EngineGroup, model: int) -> dict[str, Any]:
    """Engine `model`'s stats, asked for now."""
    group.stats.pop(model, None)
    group.control(model, {"op": "stats"})
    deadline = time.monotonic() + 30
    while model not in group.stats:
        assert time.monotonic() < deadline, f"engine {model} sent no stats"
        group.pump(timeout=0.1)
    return group.stats[model]


def cache_hits(group: EngineGroup, n_models: int) -> dict[int, int]:
    """Tokens each engine has taken from its prefix cache since it started."""
    return {m: fresh_stats(group, m)["prefix_cache"]["hits"] for m in range(n_models)}
