"""The transformers systems on the GPU: what a user without a serving engine runs.

    python -m trd.bench.gpu.stage hf CTX OUT.json LIMIT_S

official     the research-code loop (trd/bench/compare/systems.py `OfficialLoop`: the
             reference loop with a KV cache per request and model, one request at a
             time) with the same ensemble schedule, on the first `official_prompts`
             prompts, at the first share, then (time allowing) the others
hf_generate  the large model alone through transformers' `generate` with its static
             cache, N prompts in one batch (equal lengths: no padding), greedy, no EOS
             stop. Compilation off (`disable_compile`): inductor compiles an 8B forward
             per batch size in minutes, more than the run's budget; the result says so.

Both load the pair once (the official loop's models; generate uses its large one). Every
output is checked against the designed tokens; the HBM bound counts one forward per token
(the loop) or one step per token of a batch (generate).
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import torch
from transformers import GenerationConfig

from trd.bench.compare.runner import Bench
from trd.bench.compare.systems import OfficialLoop
from trd.bench.gpu.bounds import model_bytes
from trd.bench.gpu.measure import add_hbm, make_run
from trd.bench.gpu.plan import Ctx
from trd.bench.gpu.workload import NAMES, Designed, prompts, routing
from trd.bench.identity import digest_ids
from trd.bench.record import Record
from trd.bench.stages import Partial, log


class Transformers:
    def __init__(self, ctx: Ctx, out: Partial, deadline: float) -> None:
        self.ctx, self.out, self.deadline = ctx, out, deadline
        plan = ctx.plan
        self.models = ctx.pair_paths()
        count = max(plan.official_prompts, max(plan.generate_ns))
        self.prompts = prompts(self.models["small"], count, plan.prompt_tokens)
        self.sizes = {m: model_bytes(p, plan.dtype) for m, p in self.models.items()}

    def sync(self) -> None:
        if self.ctx.plan.device != "cpu":
            torch.cuda.synchronize()

    def official(self, share: float) -> OfficialLoop:
        plan = self.ctx.plan
        start = time.perf_counter()
        loop = OfficialLoop(self.models, routing(share, plan.seed), plan.max_tokens,
                            plan.dtype, plan.device)  # fmt: skip
        self.out.put("official_load_s", round(time.perf_counter() - start, 1))
        self.out.put("official_config", loop.config())
        jobs = self.prompts[: plan.official_prompts]
        records, wall = asyncio.run(Bench.load(loop, jobs, 1, f"official {share}"))
        run = make_run(self.ctx, "official", share, 1, plan.max_tokens, records, wall,
                       Designed(jobs, plan.max_tokens, share, plan.seed))  # fmt: skip
        work = {m: (sum((r.tokens_per_model or {}).get(m, 0) for r in records),) * 2
                for m in NAMES}  # fmt: skip
        add_hbm(self.ctx, run, work, self.sizes)
        self.out.append("runs", run)
        log(f"official share {share}: {run['output_throughput']:.1f} tok/s in {wall:.1f} s")
        return loop

    def generate(self, model: Any, n: int) -> None:  # a PreTrainedModel
        plan = self.ctx.plan
        jobs = self.prompts[:n]
        ids = torch.tensor(jobs, device=plan.device)

        def timed(tokens: int) -> tuple[float, torch.Tensor]:
            cfg = GenerationConfig(max_new_tokens=tokens, do_sample=False, pad_token_id=0,
                                   eos_token_id=None, cache_implementation="static",
                                   disable_compile=True)  # fmt: skip
            self.sync()
            start = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                     generation_config=cfg)  # fmt: skip
            self.sync()
            return time.perf_counter() - start, out[:, ids.shape[1] :]

        first, _ = timed(1)
        wall, out = timed(plan.max_tokens)
        records = []
        for i, (prompt, row) in enumerate(zip(jobs, out.tolist(), strict=True)):
            records.append(Record(
                i, 0, digest_ids(prompt), 0.0, ttft=first, latency=wall,
                output_tokens=len(row), counted_by="token_ids", token_ids=row,
                models=["large"] * len(row), tokens_per_model={"small": 0, "large": len(row)},
                prompt_ids=prompt,
            ))  # fmt: skip
        run = make_run(self.ctx, "hf_generate", None, n, plan.max_tokens, records, wall,
                       Designed(jobs, plan.max_tokens, None, plan.seed))  # fmt: skip
        add_hbm(self.ctx, run, {"large": (plan.max_tokens, n * plan.max_tokens)}, self.sizes)
        self.out.append("runs", run)
        log(f"hf_generate N={n}: {run['output_throughput']:.1f} tok/s (prefill {first:.2f} s)")

    def left_s(self) -> float:
        return self.deadline - time.monotonic()


def stage(ctx: Ctx, out: Partial, args: list[str]) -> bool:
    deadline = time.monotonic() + float(args[0])
    hf = Transformers(ctx, out, deadline)
    shares = ctx.plan.shares
    start = time.monotonic()
    loop = hf.official(shares[0])
    official_s = time.monotonic() - start
    large: Any = loop.router.models[-1]
    large.generation_config.eos_token_id = None  # EOS ignored, as in every other system
    out.put("generate_config", {"cache_implementation": "static", "compile": False,
                                "do_sample": False, "eos": None})  # fmt: skip
    for n in ctx.plan.generate_ns:
        hf.generate(large, n)
    del loop, large
    gc.collect()  # the first pair's GPU memory, before the next loop loads its own
    if ctx.plan.device != "cpu":
        torch.cuda.empty_cache()
    for share in shares[1:]:
        if hf.left_s() < 1.2 * official_s:
            out.append("skipped", f"official at share {share}: {hf.left_s():.0f} s left")
            continue
        hf.official(share)
    return all(Designed.identical(r) for r in out.data.get("runs", []))
