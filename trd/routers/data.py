"""A router's training data: the large model answers, the small model is teacher-forced.

    1. answers      the large model answers every prompt greedily (our Engine, batched)
    2. positions    the small model reads prompt + answer in one forward (transformers);
                    per answer position j it predicted: its final-norm hidden state, its
                    top-k logits (descending), its greedy token and that token's input
                    embedding, the large model's token a_j, two entropies (R-Stitch's
                    normalised one, GlimpRouter's top-20 one) for the baselines, and the
                    logits' features citer and collm read beside h (heads.logit_features:
                    top LOGPROB_K log-probabilities and those two entropies)
    3. wrongness    (citer, collm) the large model reads prompt + answer too: per
                    position, how much less likely it finds the small model's greedy token
                    than its own (nats, `gap`; 0 where they agree)
    4. divergence   (r2r) at a mismatch (small greedy g_j != a_j) the large model continues
                    greedily from prompt + a[:j] + g_j to the end of the sentence (a token
                    whose text holds . ! ? or a newline, or EOS) or 32 tokens; the mismatch
                    is divergent when that differs from its own answer after a_j, cut the
                    same way. Positions are sampled at one rate (matches and mismatches
                    alike, every prompt) so that about `budget` continuations run; the
                    others stay unlabelled (-1) and r2r skips them.

Labels (`labels`): citer and collm route to the large model where the small model is
wrong and the large one right; the large model is the teacher, right by definition on
its own answer, and the small model is wrong where the large model finds its token at
least WRONG_RATIO times less likely than its own (gap >= log WRONG_RATIO). A token the
large model itself nearly chose (a synonym, another way to start a sentence) costs
little: on the demo pair, heads trained on every mismatch (74% of positions) ranked the
costly ones no better than the entropy rule (docs/quality.md). r2r: divergent mismatches
only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.models.checkpoint import read_checkpoint
from trd.policies.heads import logit_features
from trd.policies.steps import token_texts
from trd.protocol import SamplingParams

TOP_K = 100  # R2R's top logits
LOGPROB_K = 20  # citer's and collm's top log-probabilities
WRONG_RATIO = 10.0  # citer/collm: the small token is wrong this many times less likely
CONTINUATION = 32  # tokens, at most
SENTENCE_END = ".!?\n"


@dataclass
class Positions:
    """One row per answer position of every prompt."""

    hidden: torch.Tensor  # (N, H) the small model's final-norm hidden state
    emb: torch.Tensor  # (N, H) input embedding of its greedy token
    top: torch.Tensor  # (N, TOP_K) its top logits, descending
    small: torch.Tensor  # (N,) its greedy token
    large: torch.Tensor  # (N,) the large model's token (the answer's)
    prompt: torch.Tensor  # (N,) index of the prompt
    divergent: torch.Tensor  # (N,) 1 divergent, 0 not (match or neutral), -1 unlabelled
    logit_feats: torch.Tensor  # (N, LOGPROB_K + 2) heads.logit_features of its logits
    gap: torch.Tensor  # (N,) log p_large(large's token) - log p_large(small's); NaN: not read

    @property
    def entropy(self) -> torch.Tensor:
        """(N,) normalised entropy (R-Stitch's score)."""
        return self.logit_feats[:, -2]

    @property
    def probe(self) -> torch.Tensor:
        """(N,) top-20 entropy in nats (GlimpRouter's score)."""
        return self.logit_feats[:, -1]

    @property
    def mismatch(self) -> torch.Tensor:
        """(N,) the small model's greedy token differs from the large model's."""
        return self.small != self.large

    def top_k(self, kind: str) -> int:
        """The head file's top_k for the features `features(kind)` gives."""
        return self.top.shape[1] if kind == "r2r" else LOGPROB_K

    def select(self, mask: torch.Tensor) -> Positions:
        return Positions(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    def labels(self, kind: str) -> torch.Tensor:
        """1 = route this position to the large model."""
        if kind == "r2r":
            return (self.divergent == 1).float()
        if self.gap.isnan().any():
            raise ValueError("citer/collm labels need label_wrong() first")
        return (self.gap >= math.log(WRONG_RATIO)).float()

    def features(self, kind: str) -> torch.Tensor:
        """The head's input, as the policies build it (trd/policies/gated.py)."""
        if kind == "r2r":
            return torch.cat([self.hidden, self.emb, self.top], dim=-1)
        return torch.cat([self.hidden, self.logit_feats], dim=-1)


def large_engine(large: Path, cpu_linear: str) -> Engine:
    spec = EngineSpec.of(large, dtype="float32", kv_tokens=64 * 1024, max_batch_size=64,
                         max_batch_tokens=2048, cpu_linear=cpu_linear)  # fmt: skip
    return Engine(spec)


def answer(engine: Engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The large model's greedy answers (EOS ends one; it is kept)."""
    return engine.generate(prompts, SamplingParams(max_tokens=max_tokens))


@torch.no_grad()  # not inference mode: the labels are filled in place later
def teacher_force(small: Path, prompts: list[list[int]], answers: list[list[int]]) -> Positions:
    model = AutoModelForCausalLM.from_pretrained(small, dtype=torch.float32).eval()
    vocab = read_checkpoint(small).vocab_limit  # as the engines: padding rows never count
    embed = model.get_input_embeddings()
    rows: dict[str, list[torch.Tensor]] = {f.name: [] for f in fields(Positions)}
    for i, (prompt, ans) in enumerate(zip(prompts, answers, strict=True)):
        if not ans:
            continue
        out = model(torch.tensor([prompt + ans]), output_hidden_states=True)
        at = slice(len(prompt) - 1, len(prompt) + len(ans) - 1)  # predicts ans[0..]
        logits = out.logits[0, at, :vocab]
        greedy = logits.argmax(-1)
        rows["hidden"].append(out.hidden_states[-1][0, at])
        rows["emb"].append(embed(greedy))
        rows["top"].append(torch.topk(logits, min(TOP_K, vocab), dim=-1).values)
        rows["small"].append(greedy)
        rows["large"].append(torch.tensor(ans))
        rows["prompt"].append(torch.full((len(ans),), i))
        rows["divergent"].append(torch.full((len(ans),), -1, dtype=torch.int8))
        rows["logit_feats"].append(logit_features(logits, LOGPROB_K))
        rows["gap"].append(torch.full((len(ans),), math.nan))
    return Positions(**{k: torch.cat(v) for k, v in rows.items()})


@torch.no_grad()
def label_wrong(
    large: Path, prompts: list[list[int]], answers: list[list[int]], pos: Positions
) -> None:
    """Fill `pos.gap`: the large model teacher-forced over each prompt + answer."""
    model = AutoModelForCausalLM.from_pretrained(large, dtype=torch.float32).eval()
    vocab = read_checkpoint(large).vocab_limit
    row = 0
    for prompt, ans in zip(prompts, answers, strict=True):
        if not ans:
            continue
        at = slice(len(prompt) - 1, len(prompt) + len(ans) - 1)
        logp = model(torch.tensor([prompt + ans])).logits[0, at, :vocab].log_softmax(-1)
        rows = slice(row, row + len(ans))
        own = logp.gather(1, pos.large[rows, None])[:, 0]
        pos.gap[rows] = own - logp.gather(1, pos.small[rows, None])[:, 0]
        row += len(ans)


def stop_tokens(model_dir: Path) -> list[int]:
    """Ids that end a sentence: their text holds one of SENTENCE_END."""
    ckpt = read_checkpoint(model_dir)
    texts = token_texts(model_dir, ckpt.vocab_limit)
    return [i for i, t in enumerate(texts) if any(c in t for c in SENTENCE_END)]


def _cut(tokens: list[int], stops: set[int], ended: bool) -> tuple[list[int], bool]:
    """The continuation to the end of its sentence (inclusive), at most CONTINUATION tokens;
    and whether it is whole: ended by that rule, or `ended` (nothing follows, by EOS)
    rather than cut short by the answer's max_tokens."""
    for k, t in enumerate(tokens[:CONTINUATION]):
        if t in stops:
            return tokens[: k + 1], True
    return tokens[:CONTINUATION], ended or len(tokens) >= CONTINUATION


def label_divergence(
    engine: Engine,
    prompts: list[list[int]],
    answers: list[list[int]],
    pos: Positions,
    budget: int,
    seed: int = 0,
) -> int:
    """Fill `pos.divergent` for a random sample of positions (matches and mismatches at
    one rate, all prompts) holding about `budget` mismatches; returns how many
    continuations ran."""
    eos = set(engine.cfg.eos_token_ids)
    stops = set(stop_tokens(engine.spec.checkpoint.path)) | eos
    wrong = pos.mismatch
    rate = min(1.0, budget / max(1, int(wrong.sum())))
    gen = torch.Generator().manual_seed(seed)
    labelled = torch.rand(len(wrong), generator=gen) < rate
    starts = {int(p): int(i) for i, p in reversed(list(enumerate(pos.prompt.tolist())))}
    jobs: list[tuple[int, list[int]]] = []  # (row, prefix)
    for r in (labelled & wrong).nonzero().flatten().tolist():
        p, j = int(pos.prompt[r]), r - starts[int(pos.prompt[r])]
        jobs.append((r, prompts[p] + answers[p][:j] + [int(pos.small[r])]))
    run = [prefix for r, prefix in jobs if int(pos.small[r]) not in eos]
    params = SamplingParams(max_tokens=CONTINUATION, stop_token_ids=tuple(sorted(stops)))
    outs = iter(engine.generate(run, params) if run else [])
    pos.divergent[labelled] = 0
    for r, _ in jobs:
        p = int(pos.prompt[r])
        ended = answers[p][-1] in eos
        own, whole = _cut(answers[p][r - starts[p] + 1 :], stops, ended)
        # The small model's EOS ends the answer: nothing follows it.
        theirs = [] if int(pos.small[r]) in eos else _cut(next(outs), stops, True)[0]
        same = theirs == own if whole else theirs[: len(own)] == own
        pos.divergent[r] = 0 if same else 1
    return len(jobs)
