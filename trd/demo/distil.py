"""Distillation of the partner on the teacher's top-k next-token distributions.

The loss at a labelled position is KL(teacher || student) over the teacher's TOP_K
tokens plus one bucket for the rest of the vocabulary:

    sum_{i in top-k} p_i log(p_i / q_i)  +  p_rest log(p_rest / q_rest)

which needs the student's full log-normaliser (one pass over its 49152 logits) but
none of the teacher's logits. The student's logits are computed only at labelled
positions, which also skips the 49152-wide projection at prompt positions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import LlamaForCausalLM

from trd.demo.teacher import Example

WARMUP_FRACTION = 0.05
# AdamW as in the fixtures' training; no weight decay, the starting point is the teacher's.
BETAS = (0.9, 0.95)
# Keeps log(p_rest) finite where the top-k hold (numerically) all the mass.
_TINY = 1e-6


@dataclass(frozen=True, slots=True)
class Batch:
    input_ids: torch.Tensor  # (B, L), right-padded
    attention_mask: torch.Tensor  # (B, L)
    rows: torch.Tensor  # (N,) batch row of each labelled position
    cols: torch.Tensor  # (N,) its position in the row
    top_ids: torch.Tensor  # (N, K) the teacher's top-k tokens there
    top_logp: torch.Tensor  # (N, K) and their log-probabilities


def collate(examples: Sequence[Example], pad_id: int) -> Batch:
    length = max(len(ex.tokens) for ex in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    rows, cols = [], []
    for i, ex in enumerate(examples):
        ids[i, : len(ex.tokens)] = torch.tensor(ex.tokens)
        mask[i, : len(ex.tokens)] = 1
        n = len(ex.top_ids)
        rows.append(torch.full((n,), i))
        cols.append(torch.arange(ex.start, ex.start + n))
    return Batch(
        ids,
        mask,
        torch.cat(rows),
        torch.cat(cols),
        torch.cat([ex.top_ids for ex in examples]),
        torch.cat([ex.top_logp for ex in examples]),
    )


def output_weight(model: LlamaForCausalLM) -> torch.Tensor:
    """The frozen (V, H) output layer in bfloat16, for `student_logits`."""
    return model.get_output_embeddings().weight.detach().to(torch.bfloat16)


def student_logits(model: LlamaForCausalLM, batch: Batch, weight: torch.Tensor) -> torch.Tensor:
    """(N, V) float32 logits at the labelled positions.

    Matrix products run in bfloat16 (about 4x faster than float32 on CPUs with AVX-512
    BF16; float32 weights and optimiser state). The output layer is most of a step
    (49152 x 576 per labelled position, forward and backward); rounding its input
    changes the teacher's own top-1 at ~1% of positions. Norms and softmax stay float32.
    """
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    hidden = out.last_hidden_state[batch.rows, batch.cols]  # (N, H)
    return F.linear(hidden.to(torch.bfloat16), weight).float()


def kl_loss(logits: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor) -> torch.Tensor:
    """Mean over positions of the top-k-plus-rest KL(teacher || student), nats."""
    logq = logits.gather(-1, top_ids) - torch.logsumexp(logits, dim=-1, keepdim=True)  # (N, K)
    p = top_logp.exp()
    p_rest = (1 - p.sum(-1)).clamp_min(_TINY)
    q_rest = (1 - logq.exp().sum(-1)).clamp_min(_TINY)
    kl = (p * (top_logp - logq)).sum(-1) + p_rest * (p_rest.log() - q_rest.log())
    return kl.mean()


def _lr_factor(step: int, steps: int) -> float:
    """Linear warmup, then cosine decay to zero."""
    warmup = max(1, int(steps * WARMUP_FRACTION))
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def distil(
    model: LlamaForCausalLM,
    examples: Sequence[Example],
    *,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    pad_id: int,
    progress: bool,
) -> list[float]:
    """Train every weight but the tied embedding; returns the loss of each step."""
    model.get_input_embeddings().weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=BETAS, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, steps))
    gen = torch.Generator().manual_seed(seed)
    weight = output_weight(model)
    losses = []
    model.train()
    bar = tqdm(range(steps), desc="distil", disable=not progress)
    for _ in bar:
        pick = torch.randint(0, len(examples), (batch,), generator=gen).tolist()
        b = collate([examples[i] for i in pick], pad_id)
        loss = kl_loss(student_logits(model, b, weight), b.top_ids, b.top_logp)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(kl=f"{loss.item():.3f}")
    model.eval()
    return losses
