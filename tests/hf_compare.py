"""Our engine against transformers on one checkpoint: the runs and the logits to compare.

`engine_runs` batches the prompts through our engine (prefill, then greedy decodes);
`hf_logits` replays each resulting sequence through transformers the way `generate`
runs one sequence: the prompt in one call, then one token per call on its KV cache, a
fresh model per sequence (the `dynamic` rope variant keeps state across calls).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.protocol import SamplingParams

DECODE_STEPS = 64


@dataclass(frozen=True)
class Run:
    prompt_len: int
    seq: list[int]  # prompt + every token the engine produced
    logits: torch.Tensor  # (steps + 1, V) the engine's next-token logits at each step


def engine_runs(
    path: Path,
    dtype: str,
    prompts: list[list[int]],
    steps: int = DECODE_STEPS,
    temperature: float = 0.0,
    **settings: Any,
) -> list[Run]:
    """Prefill + `steps` decodes of every prompt, batched; small pages and chunked prefill."""
    settings = {"page_size": 4, "kv_tokens": 1024, "max_batch_tokens": 32, **settings}
    engine = Engine(EngineSpec.of(path, dtype=dtype, **settings))
    params = SamplingParams(max_tokens=steps + 1, ignore_eos=True, temperature=temperature,
                            seed=1 if temperature else None)  # fmt: skip
    rids = [engine.add_request(p, params) for p in prompts]
    rows: dict[int, list[torch.Tensor]] = {rid: [] for rid in rids}
    seqs: dict[int, list[int]] = {}
    while engine.has_unfinished():
        result = engine.forward()
        assert result is not None and not result.failed
        for i, (req, token) in enumerate(zip(result.requests, result.tokens, strict=True)):
            rows[req.rid].append(result.forward.logits[i].clone())
            seqs[req.rid] = req.seq
            engine.commit(req, [token])
    return [Run(len(p), seqs[r], torch.stack(rows[r])) for p, r in zip(prompts, rids, strict=True)]


def load_hf(path: Path, dtype: str) -> Any:
    return AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype), attn_implementation="sdpa"
    ).eval()


@torch.no_grad()
def hf_logits(path: Path, dtype: str, run: Run) -> torch.Tensor:
    """transformers' next-token logits along run.seq, (steps + 1, V_rows), KV-cached."""
    model = load_hf(path, dtype)
    seq = torch.tensor([run.seq])
    out = model(seq[:, : run.prompt_len], use_cache=True)
    rows = [out.logits[0, -1]]
    for t in range(run.prompt_len, len(run.seq) - 1):
        out = model(seq[:, t : t + 1], cache=out.cache, use_cache=True)
        rows.append(out.logits[0, -1])
    return torch.stack(rows)


@torch.no_grad()
def hf_greedy(model: Any, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """transformers' greedy tokens after each prompt: `generate` over the prompts,
    left-padded into one batch (a third of the time of one prompt at a time, with the
    same tokens). A row that writes EOS goes on, as the engine's `ignore_eos` does."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = GenerationConfig(max_new_tokens=steps, do_sample=False, pad_token_id=0)
    eos, model.generation_config.eos_token_id = model.generation_config.eos_token_id, None
    try:  # the model's own EOS would still end rows: `generate` falls back to it
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    finally:
        model.generation_config.eos_token_id = eos
    assert out.shape[1] == width + steps
    return [row[width:].tolist() for row in out]


def max_diff(path: Path, dtype: str, runs: list[Run]) -> float:
    """The largest |ours - transformers'| over every run's logits (the real vocabulary)."""
    worst = 0.0
    for run in runs:
        ref = hf_logits(path, dtype, run)
        assert ref.shape[0] == run.logits.shape[0] == len(run.seq) - run.prompt_len
        ours = run.logits
        worst = max(worst, (ours - ref[:, : ours.shape[1]].to(ours.dtype)).abs().max().item())
    return worst
