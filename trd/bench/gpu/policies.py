"""Every routing policy's device path on the shaped pair's real shapes: CUDA graphs on
against the same policy on the same weights with graphs off, token for token.

    python -m trd.bench.gpu.stage policies CTX OUT.json

The pair's two engines are loaded once per graphs setting, in this process, and each
policy in turn is put on them (trd/testing/wiring.py: the engines in turn, the real
codec between them); `policy_requests` prompts at once, `policy_tokens` tokens each.
Every request asks `routing.large_share` (trd/policies/budget.py), so each policy hands
over a known share whatever its scores: on the shaped weights R-Stitch's and
GlimpRouter's entropies are exactly 0 at every position (trd/testing/shaped.py), and the
heads made here for the pair (its hidden size) are CITER's and Co-LLM's with zero
weights (every score ties) and R2R's reading only the sampled token's embedding (its
scores differ by token, never by rounding): ties and token-only scores leave the
decisions to the request's counts and tokens, so graphs on and off must agree exactly.
Compared: the token ids and the model of each token (graphs on vs off), and the tokens
against what the shaped weights write for those models (`expected_tokens`).
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import time
from pathlib import Path
from typing import Any

import torch

from trd.bench.gpu.plan import Ctx
from trd.bench.gpu.workload import prompts
from trd.bench.stages import Partial, log
from trd.engines.engine import Engine
from trd.engines.graphs import StepGraphs
from trd.engines.router import RoutingEngine
from trd.engines.spec import EngineSpec
from trd.models.checkpoint import read_checkpoint
from trd.policies.base import PolicyContext
from trd.policies.factory import make_policy
from trd.policies.heads import save_head
from trd.policies.params import PolicySpec
from trd.protocol import RoutingParams, SamplingParams
from trd.testing.shaped import expected_tokens
from trd.testing.wiring import Job, Wiring


def make_heads(folder: Path, hidden: int) -> dict[str, Path]:
    """CITER's and Co-LLM's heads with zero weights; R2R's reading the token's embedding."""
    folder.mkdir(parents=True, exist_ok=True)
    zero = [(torch.zeros(1, hidden), torch.zeros(1))]
    gen = torch.Generator().manual_seed(5)
    w1 = torch.cat([torch.zeros(16, hidden), torch.randn(16, hidden, generator=gen)], dim=1)
    r2r = [
        (w1 * hidden**-0.5, torch.zeros(16)),
        (torch.randn(1, 16, generator=gen), torch.zeros(1)),
    ]
    return {kind: save_head(folder / f"{kind}.safetensors", kind, layers, threshold=0.5)
            for kind, layers in (("citer", zero), ("collm", zero), ("r2r", r2r))}  # fmt: skip


def policy_spec(name: str, heads: dict[str, Path]) -> PolicySpec:
    if name in heads:
        return PolicySpec(name, {"head": str(heads[name]), "threshold": 0.5})
    return PolicySpec(name, {"threshold": 0.5} if name == "rstitch" else
                      {"threshold": 1.0, "step_tokens": 8})  # fmt: skip


def load(ctx: Ctx, graphs: bool) -> list[Engine]:
    plan = ctx.plan
    engines = []
    for i, path in enumerate(ctx.pair_paths().values()):
        spec = EngineSpec.of(path, index=i, num_models=2, dtype=plan.dtype, device=plan.device,
                             kv_tokens=plan.policy_requests * 512, cuda_graphs=graphs,
                             prefix_cache=False)  # fmt: skip
        engine = Engine(spec)
        if plan.dry_run and graphs:  # the graphs' padding and buffers, run eagerly
            engine.runner.graphs = StepGraphs(engine.runner, spec.settings, capture=False)
        engines.append(engine)
    return engines


def route(engines: list[Engine], policy: PolicySpec, work: list[Job]) -> list[Any]:
    specs = [dataclasses.replace(e.spec, policy=policy) for e in engines]

    def make(spec: EngineSpec, send: Any) -> RoutingEngine:
        engine = engines[spec.index]
        embed = engine.runner.model.model.embed_tokens
        pctx = PolicyContext(spec.index, len(specs), embed, spec.checkpoint.path)
        return RoutingEngine(engine, make_policy(policy, pctx), send)

    return Wiring(specs, make=make).run(work)


def stage(ctx: Ctx, out: Partial, args: list[str]) -> bool:
    plan = ctx.plan
    hidden = read_checkpoint(ctx.pair_paths()["small"]).config.hidden_size
    heads = make_heads(ctx.work / "heads", hidden)
    params = SamplingParams(max_tokens=plan.policy_tokens, ignore_eos=True,
                            routing=RoutingParams(large_share=plan.policy_share))  # fmt: skip
    work = [(p, params) for p in prompts(ctx.pair_paths()["small"], plan.policy_requests,
                                         plan.prompt_tokens)]  # fmt: skip
    runs: dict[bool, dict[str, Any]] = {}
    for graphs in (True, False):
        start = time.perf_counter()
        engines = load(ctx, graphs)
        out.put(f"load_s_graphs_{'on' if graphs else 'off'}", round(time.perf_counter() - start, 1))
        runs[graphs] = {}
        for name in plan.policies:
            start = time.perf_counter()
            gens = route(engines, policy_spec(name, heads), work)
            runs[graphs][name] = ([g.tokens for g in gens], [g.models for g in gens])
            log(f"{name} graphs {'on' if graphs else 'off'}: {time.perf_counter() - start:.1f} s")
        replays = [e.runner.graphs.used.total() for e in engines if e.runner.graphs]
        out.put(f"replays_graphs_{'on' if graphs else 'off'}", replays)
        del engines
        gc.collect()  # runner <-> graphs cycles hold the GPU memory
        if plan.device != "cpu":
            torch.cuda.empty_cache()
    ok = True
    for name in plan.policies:
        (on_t, on_m), (off_t, off_m) = runs[True][name], runs[False][name]
        designed = [expected_tokens(p, len(m), m) for (p, _), m in zip(work, on_m, strict=True)]
        tokens = sum(len(t) for t in on_t)
        row = {"equal": on_t == off_t and on_m == off_m, "as_designed": on_t == designed,
               "large_share": sum(map(sum, on_m)) / max(1, tokens), "tokens": tokens,
               "handoffs": sum(sum(a != b for a, b in itertools.pairwise(m)) for m in on_m),
               "mismatch": first_difference(on_t, on_m, off_t, off_m)}  # fmt: skip
        out.append("policies", {"policy": name, **row})
        log(f"policy {name}: {row}")
        ok = ok and row["equal"] and row["as_designed"] and 0 < row["large_share"] < 1
    return ok


def first_difference(a_t: list[Any], a_m: list[Any], b_t: list[Any], b_m: list[Any]) -> str:
    """Where graphs on and off first differ: the request, the position, token or model."""
    for rid, (ta, ma, tb, mb) in enumerate(zip(a_t, a_m, b_t, b_m, strict=True)):
        a, b = list(zip(ta, ma, strict=True)), list(zip(tb, mb, strict=True))
        for pos, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return f"request {rid} position {pos}: (token, model) {x} vs {y}"
        if len(ta) != len(tb):
            return f"request {rid}: {len(ta)} vs {len(tb)} tokens"
    return ""
