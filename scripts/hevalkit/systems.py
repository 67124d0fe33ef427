"""The systems compared: one model alone, or a routing policy held at a large share.

A system is named `small`, `large` (a one-model daemon: that model makes every token) or
`POLICY@SHARE` (both models, `policy.target_large_share: SHARE`: the daemon's share
control moves the policy's threshold to hold the large model's share of committed tokens
there; it starts from START_THRESHOLDS, measured on this pair with the body prompt, so
the run spends fewer tokens away from the target). Each system gets a daemon of its own,
configured from the user's config (its `models:` and engine settings; listen, admin and
policy are replaced) or from two model folders.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from benchkit.systems import Daemon, free_port, start_daemon

HEADS = ("citer", "r2r", "collm")
POLICIES = ("rstitch", "glimp", *HEADS)
# policy -> (target share -> first threshold); the share control takes it from there.
# rstitch: the 0.5B's normalised entropy on its own completions of the first 16 problems
# (867 tokens, body prompt) is above 0.0755 / 0.046 / 0.017 / 0.002 at 10 / 20 / 30 / 50%
# of them, but the 1.5B keeps the tokens after a handoff while it is unsure: at 0.025
# the routed run's first window had 41.7% large tokens (about 1.4 times), hence higher.
# glimp: the 0.5B's probe entropy (top-20, nats) at the start of each step (blank-line
# separated) of its own body completions of all 164 problems (scripts/glimp_thresholds.py:
# 237 steps, 13,293 tokens): the steps it would hand over hold 10 / 20 / 30 / 50% of the
# tokens from 0.216 / 0.167 / 0.125 / 0.094 up (at 0.7, the start used before, 0.2%). The
# 30% run of 2026-12-04 started from 0.135, an earlier version's figure (its JSON says so).
START_THRESHOLDS: dict[str, dict[float, float]] = {
    "rstitch": {0.1: 0.1, 0.2: 0.06, 0.3: 0.04, 0.5: 0.01},
    "glimp": {0.1: 0.216, 0.2: 0.167, 0.3: 0.125, 0.5: 0.094},
}


def parse_system(name: str) -> tuple[str, float | None]:
    """`small` / `large` -> (name, None); `rstitch@0.3` -> ("rstitch", 0.3)."""
    if name in ("small", "large"):
        return name, None
    policy, _, share = name.partition("@")
    if policy not in POLICIES or not share:
        raise ValueError(f"system {name!r}: expected small, large or POLICY@SHARE ({POLICIES})")
    target = float(share)
    if not 0 < target < 1:
        raise ValueError(f"system {name!r}: the share must be in (0, 1)")
    return policy, target


def base_config(config: Path | None, small: Path | None, large: Path | None) -> dict[str, Any]:
    """The user's config file, or one made for two model folders (CPU, bfloat16)."""
    if config is not None:
        cfg: dict[str, Any] = yaml.safe_load(config.read_text())
        if len(cfg.get("models", [])) != 2:
            raise ValueError(f"{config}: expected two models: entries (small first)")
        return cfg
    if small is None or large is None:
        raise ValueError("give --config, or --small and --large")
    return {
        "device": "cpu",
        "mps": "off",
        "memory": {"max_kv_tokens": 16384},
        "max_model_len": 2048,
        "models": [
            {"name": "small", "path": str(small), "dtype": "bfloat16"},
            {"name": "large", "path": str(large), "dtype": "bfloat16"},
        ],
        "shutdown": {"grace_s": 5},
        # A prefill chunk of the 1.5B took over 120 s (the default) on 2 shared cores.
        "stall_timeout_s": 3600,
        # One thread per engine, also when every request is on one engine: on a CPU that
        # other work shares, a second thread waits at OpenMP barriers for a thread that is
        # not scheduled (2 threads on 2 busy cores: 10.9 s per 0.5B step at batch 16).
        "engine": {"threads": 1, "threads_alone": 1},
    }


def system_config(base: dict[str, Any], system: str, heads: Path | None = None) -> dict[str, Any]:
    """The daemon config of one system."""
    cfg = copy.deepcopy(base)
    cfg["listen"] = f"127.0.0.1:{free_port()}"
    cfg["admin"] = f"127.0.0.1:{free_port()}"
    cfg.pop("batching", None)  # thresholds name the models; the defaults suit both layouts
    small, large = cfg["models"]
    policy, target = parse_system(system)
    if target is None:
        cfg["models"] = [small if system == "small" else large]
        cfg["policy"] = {"name": "rstitch"}
        return cfg
    params: dict[str, Any] = {"name": policy, "target_large_share": target}
    if policy in HEADS:
        if heads is None:
            raise ValueError(f"system {system!r} needs --heads (tokenrouterd train-router)")
        params["head"] = str(heads / f"{policy}.safetensors")
    else:
        params["threshold"] = START_THRESHOLDS[policy].get(target, 0.02)
    cfg["policy"] = params
    return cfg


def start(system: str, cfg: dict[str, Any], folder: Path) -> Daemon:
    folder.mkdir(parents=True, exist_ok=True)
    return start_daemon(system.replace("@", "_"), cfg, folder)


def dump(cfg: dict[str, Any]) -> str:
    return yaml.safe_dump(cfg, sort_keys=False)
