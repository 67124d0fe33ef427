"""Brief, seeded training of a fixture model and its held-out statistics.

The fixture models need not be good, only realistic for routing: the larger
model must predict better, and the small model's next-token entropy must vary
across positions (a near-uniform or a constant entropy would make every
threshold policy trivial).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer
from torch import nn
from tqdm import tqdm

from trd.testing.tinymodels.tokenizer import EOS_ID, VOCAB_SIZE

SEQ_LEN = 128
# Held-out statistics come from this many non-overlapping windows at the start of the split.
EVAL_WINDOWS = 16
WARMUP_FRACTION = 0.1
# The schedule decays to this fraction of the peak rate.
FINAL_LR_FRACTION = 0.1


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Held-out loss (nats per token) and normalised next-token entropy quantiles."""

    loss: float
    entropy_p10: float
    entropy_p50: float
    entropy_p90: float


def token_stream(tok: Tokenizer, docs: list[str]) -> torch.Tensor:
    """All documents back to back, each followed by EOS so a model learns to stop."""
    ids: list[int] = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.long)


def _lr_factor(step: int, steps: int) -> float:
    warmup = max(1, int(steps * WARMUP_FRACTION))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return FINAL_LR_FRACTION + (1.0 - FINAL_LR_FRACTION) * cosine


def train(
    model: nn.Module,
    stream: torch.Tensor,
    *,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    progress: str | None,
) -> None:
    """AdamW on random SEQ_LEN windows of stream; same seed and stream, same weights.

    progress is the tqdm description, or None for no bar.
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, steps))
    model.train()
    bar = tqdm(range(steps), desc=progress, disable=progress is None, leave=False)
    for _ in bar:
        starts = torch.randint(0, len(stream) - SEQ_LEN, (batch,), generator=gen)
        x = torch.stack([stream[s : s + SEQ_LEN] for s in starts.tolist()])
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        bar.set_postfix(loss=f"{loss.item():.3f}")
    model.eval()


@torch.no_grad()
def next_token_stats(model: nn.Module, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position loss and normalised entropy H = -sum p log p / log V, both flat.

    windows: (N, T) token ids; position t predicts token t+1, so N*(T-1) values.
    """
    logits = model(input_ids=windows).logits[:, :-1].float()  # (N, T-1, V)
    logp = torch.log_softmax(logits, dim=-1)
    target = windows[:, 1:].unsqueeze(-1)  # (N, T-1, 1)
    loss = -logp.gather(-1, target).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1) / math.log(VOCAB_SIZE)
    return loss.flatten(), entropy.flatten()


def heldout_windows(stream: torch.Tensor, count: int = EVAL_WINDOWS) -> torch.Tensor:
    """The first count non-overlapping SEQ_LEN windows of a held-out stream: (count, SEQ_LEN)."""
    return stream[: count * SEQ_LEN].view(count, SEQ_LEN)


def evaluate(model: nn.Module, windows: torch.Tensor) -> Evaluation:
    loss, entropy = next_token_stats(model, windows)
    p10, p50, p90 = torch.quantile(entropy, torch.tensor([0.1, 0.5, 0.9])).tolist()
    return Evaluation(loss.mean().item(), p10, p50, p90)
