"""A router's training data: the large model answers, the small model is teacher-forced.

    1. answers      the large model answers every prompt greedily (our Engine, all prompts
                    in one batch, the pair's stored dtype), and at each answer position
                    gives its log-probability of its own token and its top LOGPROB_K
                    tokens with theirs
    2. positions    the small model reads prompt + answer in one forward (transformers,
                    a few answers per forward); per answer position j it predicted: its
                    final-norm hidden state, its top-k logits (descending), its greedy
                    token and that token's input embedding, the large model's token a_j,
                    two entropies (R-Stitch's normalised one, GlimpRouter's top-20 one) for
                    the baselines, and the logits' features citer and collm read beside h
                    (heads.logit_features: top LOGPROB_K log-probabilities and those two
                    entropies)
    3. wrongness    (citer, collm) from step 1's log-probabilities: per position, how much
                    less likely the large model finds the small model's greedy token than
                    its own (nats, `gap`; 0 where they agree). Where the small token is not
                    among the large model's top LOGPROB_K, its log-probability is at most
                    the last of them, and `gap` is that lower bound (the large model is not
                    run a second time)
    4. divergence   (r2r) at a mismatch (small greedy g_j != a_j) the large model continues
                    greedily from prompt + a[:j] + g_j to the end of the sentence (a token
                    whose text holds . ! ? or a newline, or EOS) or 32 tokens; the mismatch
                    is divergent when that differs from its own answer after a_j, cut the
                    same way. Positions are sampled at one rate (matches and mismatches
                    alike, every prompt) so that about `budget` continuations run; the
                    others stay unlabelled (-1) and r2r skips them. The engine's prefix
                    cache still holds the answers' KV: a continuation feeds only the tokens
                    past its prefix's last full page.

Labels (`labels`): citer and collm route to the large model where the small model is
wrong and the large one right; the large model is the teacher, right by definition on
its own answer, and the small model is wrong where the large model finds its token at
least WRONG_RATIO times less likely than its own (gap >= log WRONG_RATIO). A token the
large model itself nearly chose (a synonym, another way to start a sentence) costs
little: on the SmolLM2 pair, heads trained on every mismatch (74% of positions) ranked the
costly ones no better than the entropy rule. r2r: divergent mismatches only.
"""

from __future__ import annotations

import json
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
FORCE_BATCH = 4  # sequences per teacher-forcing forward


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


@dataclass
class Answers:
    """The large model's greedy answers and, per answer position, its log-probabilities."""

    tokens: list[list[int]]  # per prompt (EOS ends one; it is kept)
    own: list[torch.Tensor]  # per prompt (T,): log p of its own token
    top_ids: list[torch.Tensor]  # per prompt (T, LOGPROB_K): its most likely tokens
    top_logps: list[torch.Tensor]  # per prompt (T, LOGPROB_K): theirs, descending


def stored_dtype(model_dir: Path) -> str:
    """The dtype the checkpoint is stored (and served) in: config.json's, else float32."""
    cfg = json.loads((model_dir / "config.json").read_text())
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")


def large_engine(
    large: Path, cpu_linear: str, dtype: str, prompts: list[list[int]], max_tokens: int
) -> Engine:
    """Every prompt decodes in one batch; the KV holds all answers half again, so that
    their pages stay cached (prefix cache) while the r2r continuations run."""
    answers = sum(len(p) for p in prompts) + len(prompts) * max_tokens
    spec = EngineSpec.of(large, dtype=dtype, kv_tokens=answers * 3 // 2 + 4096,
                         max_batch_size=max(1, len(prompts)), max_batch_tokens=2048,
                         cpu_linear=cpu_linear)  # fmt: skip
    return Engine(spec)


def answer(engine: Engine, prompts: list[list[int]], max_tokens: int) -> Answers:
    """The large model's greedy answers with each token's log-probability and top tokens."""
    params = SamplingParams(max_tokens=max_tokens, logprobs=LOGPROB_K)
    out = Answers([], [], [], [])
    for outputs in engine.run(prompts, params):
        lps = [o.logprobs for o in outputs]
        assert all(lp is not None for lp in lps), "every step asked for log-probabilities"
        out.tokens.append([o.token for o in outputs])
        out.own.append(torch.tensor([lp.logprob for lp in lps if lp], dtype=torch.float32))
        ids = [lp.top_ids for lp in lps if lp]
        logps = [lp.top_logprobs for lp in lps if lp]
        out.top_ids.append(torch.tensor(ids, dtype=torch.long).reshape(-1, LOGPROB_K))
        out.top_logps.append(torch.tensor(logps, dtype=torch.float32).reshape(-1, LOGPROB_K))
    return out


@torch.no_grad()  # not inference mode: the labels are filled in place later
def teacher_force(
    small: Path, prompts: list[list[int]], answers: list[list[int]], dtype: str = "float32"
) -> Positions:
    """The small model over each prompt + answer, FORCE_BATCH sequences per forward
    (padded on the right: causal attention never lets a real position see the padding)."""
    model = AutoModelForCausalLM.from_pretrained(small, dtype=getattr(torch, dtype)).eval()
    vocab = read_checkpoint(small).vocab_limit  # as the engines: padding rows never count
    embed = model.get_input_embeddings()
    rows: dict[str, list[torch.Tensor]] = {f.name: [] for f in fields(Positions)}
    todo = [(i, p, a) for i, (p, a) in enumerate(zip(prompts, answers, strict=True)) if a]
    for b in range(0, len(todo), FORCE_BATCH):
        group = todo[b : b + FORCE_BATCH]
        width = max(len(p) + len(a) for _, p, a in group)
        ids = torch.tensor([p + a + [0] * (width - len(p) - len(a)) for _, p, a in group])
        out = model(ids, output_hidden_states=True)
        for k, (i, prompt, ans) in enumerate(group):
            at = slice(len(prompt) - 1, len(prompt) + len(ans) - 1)  # predicts ans[0..]
            logits = out.logits[k, at, :vocab].float()
            greedy = logits.argmax(-1)
            rows["hidden"].append(out.hidden_states[-1][k, at].float())
            rows["emb"].append(embed(greedy).float())
            rows["top"].append(torch.topk(logits, min(TOP_K, vocab), dim=-1).values)
            rows["small"].append(greedy)
            rows["large"].append(torch.tensor(ans))
            rows["prompt"].append(torch.full((len(ans),), i))
            rows["divergent"].append(torch.full((len(ans),), -1, dtype=torch.int8))
            rows["logit_feats"].append(logit_features(logits, LOGPROB_K))
            rows["gap"].append(torch.full((len(ans),), math.nan))
    return Positions(**{k: torch.cat(v) for k, v in rows.items()})


def label_wrong(answers: Answers, pos: Positions) -> None:
    """Fill `pos.gap` from the large model's log-probabilities at its answers: exact where
    the small token is among its top LOGPROB_K, else the lower bound of the last of them."""
    own = torch.cat([o for o, t in zip(answers.own, answers.tokens, strict=True) if t])
    ids = torch.cat([i for i, t in zip(answers.top_ids, answers.tokens, strict=True) if t])
    logps = torch.cat([x for x, t in zip(answers.top_logps, answers.tokens, strict=True) if t])
    hit = ids == pos.small[:, None]
    theirs = torch.where(hit.any(1), (logps * hit).sum(1), logps[:, -1])
    pos.gap[:] = torch.where(pos.mismatch, own - theirs, 0.0)


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
