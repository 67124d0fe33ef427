"""The large model's own chats, with its next-token distribution along every answer.

Self-instruct without a list of questions (Magpie-style): fed only the chat template up
to the start of a user turn (and a first word), the large model writes a plausible user
question (sampled, seeded); then it answers that question greedily, as the demo does.
Both phases run on our `Engine`, all conversations in one batch with a KV cache. At
every answer position the engine's logits are already there; their TOP_K log-probs are
kept as the distillation target.

    tokens:  <system> <|im_start|>user\\n QUESTION <|im_end|>\\n<|im_start|>assistant\\n ANSWER
    labelled:                                                               ^ ^^^^^^^^^
    (position p is labelled with the teacher's distribution over token p + 1)
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from trd.engines.engine import Engine
from trd.engines.request import Request
from trd.engines.spec import EngineSpec
from trd.protocol import SamplingParams
from trd.rng import uniform

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
USER_PREFIX = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
ASSISTANT_PREFIX = "\n<|im_start|>assistant\n"
# Questions are sampled at the model's own temperature (diverse topics) from its top
# candidates (the far tail turns them into word salad). top-k by `torch.topk` rather than
# the engine's sampler, which sorts the whole 49152-token vocabulary of every row.
QUESTION_TEMPERATURE, QUESTION_TOP_K = 1.0, 40
# The first word of each question, in turn: without it nearly every question the model
# writes starts "Can you", while users also ask for facts, code, sums and poems.
STARTERS = (
    "Can",
    "What",
    "How",
    "Write",
    "Why",
    "Explain",
    "Who",
    "Give",
    "I",
    "List",
    "Is",
    "Tell",
)
# Kept log-probs per position: at least QUESTION_TOP_K, and enough that the tail beyond
# them (one bucket in the loss) holds little mass at most positions.
TOP_K = 64
# The teacher runs in bfloat16: twice as fast on CPU, and its next-token distributions
# stay within 0.002 nats (KL) of float32, with the same top-1 at ~98.5% of positions.
TEACHER_DTYPE = "bfloat16"
# Room for the KV of a whole batch of conversations on one engine.
KV_TOKENS = 65536


@dataclass(frozen=True, slots=True)
class Example:
    """One conversation; the teacher's TOP_K log-probs at positions start, start + 1, ..."""

    tokens: list[int]
    start: int  # the last token of the assistant header: it predicts the first answer token
    top_ids: torch.Tensor  # (answer length, TOP_K) int64, most likely first
    top_logp: torch.Tensor  # (answer length, TOP_K) float32 log-probabilities


def _top_k_sample(
    logits: torch.Tensor, seeds: Sequence[int], positions: Sequence[int]
) -> list[int]:
    """One token per row from its QUESTION_TOP_K best at QUESTION_TEMPERATURE.

    The uniform draw depends on (seed, position) only, never on the other rows.
    """
    top, ids = torch.topk(logits, QUESTION_TOP_K, dim=-1)
    cum = torch.softmax(top / QUESTION_TEMPERATURE, dim=-1).cumsum(-1)
    u = torch.tensor([[uniform(s, p)] for s, p in zip(seeds, positions, strict=True)])
    pick = torch.searchsorted(cum, u * cum[:, -1:]).clamp_(max=QUESTION_TOP_K - 1)
    return ids.gather(-1, pick).squeeze(-1).tolist()


@dataclass(slots=True)
class _Chat:
    """One conversation in flight: asking until the question ends, then answering."""

    seed: int
    answer_start: int | None = None  # position of the first answer token, once asked
    top: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # per answer token
    tokens: list[int] = field(default_factory=list)  # the whole conversation, once over


def converse(
    large_dir: Path, seeds: Sequence[int], max_question: int, max_answer: int, progress: bool
) -> list[Example]:
    """One conversation per seed: the large model asks (sampled), then answers (greedy).

    Each conversation is one engine request: when the question ends, the assistant
    turn's header is committed after it and the same request goes on to answer, so
    nothing is fed twice. A question that does not end within max_question tokens
    is dropped. Same seeds in the same batch, same conversations (batch composition
    can move float rounding, so a seed's conversation is fixed by its batch, not alone).
    """
    torch.set_num_threads(1)
    tok = Tokenizer.from_file(str(large_dir / "tokenizer.json"))
    spec = EngineSpec.of(
        large_dir, dtype=TEACHER_DTYPE, kv_tokens=KV_TOKENS, max_batch_size=len(seeds)
    )
    engine = Engine(spec)
    eos = engine.cfg.eos_token_ids
    turn = tok.encode(ASSISTANT_PREFIX).ids
    # The engine never stops a request here (ignore_eos); the loop below ends each one.
    params = SamplingParams(max_tokens=max_question + len(turn) + max_answer, ignore_eos=True)
    chats = {
        engine.add_request(
            tok.encode(USER_PREFIX + STARTERS[s % len(STARTERS)]).ids, params
        ): _Chat(s)
        for s in seeds
    }
    total = len(seeds) * (max_question + max_answer)
    with tqdm(total=total, desc="teacher chats", unit="tok", disable=not progress) as bar:
        while (step := engine.forward()) is not None:
            if step.failed:
                raise RuntimeError(
                    f"{large_dir}: the teacher's forward failed: {step.failed[0][1]}"
                )
            reqs = step.requests  # every row: none failed
            tokens = list(step.tokens)  # greedy: the answers
            asking = [i for i, r in enumerate(reqs) if chats[r.rid].answer_start is None]
            if asking:
                sampled = _top_k_sample(
                    step.forward.logits[asking],
                    [chats[reqs[i].rid].seed for i in asking],
                    [len(reqs[i].seq) for i in asking],
                )
                for i, token in zip(asking, sampled, strict=True):
                    tokens[i] = token
            top = torch.topk(torch.log_softmax(step.forward.logits.float(), dim=-1), TOP_K)
            for i, (req, token) in enumerate(zip(reqs, tokens, strict=True)):
                chat = chats[req.rid]
                if chat.answer_start is not None:
                    chat.top.append((top.indices[i], top.values[i]))
                _advance(engine, req, chat, token, eos, turn, max_question, max_answer)
            bar.update(len(tokens))
    return [
        Example(
            c.tokens,
            c.answer_start - 1,
            torch.stack([ids for ids, _ in c.top]),
            torch.stack([logp for _, logp in c.top]),
        )
        for c in chats.values()
        if c.tokens and c.answer_start is not None
    ]


def _advance(
    engine: Engine,
    req: Request,
    chat: _Chat,
    token: int,
    eos: tuple[int, ...],
    turn: list[int],
    max_question: int,
    max_answer: int,
) -> None:
    """Commit token to the conversation; switch it to answering or end it when due."""
    if chat.answer_start is None:
        if token in eos:
            engine.commit(req, [token, *turn])
            chat.answer_start = len(req.seq)
        elif req.num_output + 1 >= max_question:
            engine.abort(req.rid)  # no question within the limit: dropped
        else:
            engine.commit(req, [token])
        return
    engine.commit(req, [token])
    if token in eos or len(req.seq) - chat.answer_start >= max_answer:
        chat.tokens = list(req.seq)
        engine.abort(req.rid)  # over: release its pages


def converse_parallel(
    large_dir: Path,
    count: int,
    *,
    seed: int,
    workers: int,
    max_question: int,
    max_answer: int,
    progress: bool,
) -> list[Example]:
    """`count` conversations, generated by `workers` one-thread processes side by side."""
    seeds = [seed * 1_000_003 + i for i in range(count)]
    shards = [seeds[w::workers] for w in range(workers)]
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        futures = [
            pool.submit(converse, large_dir, shard, max_question, max_answer, progress and w == 0)
            for w, shard in enumerate(shards)
            if shard
        ]
        return [ex for f in futures for ex in f.result()]


def questions(large_dir: Path, count: int, *, seed: int, workers: int) -> list[str]:
    """Up to `count` distinct user questions the large model writes: the first phase of
    `converse_parallel` with the same seeds (each answer is cut after one token).

    Fewer come back where a question did not end within 64 tokens or repeats another.
    """
    tok = Tokenizer.from_file(str(large_dir / "tokenizer.json"))
    turn = len(tok.encode(ASSISTANT_PREFIX).ids)
    chats = converse_parallel(
        large_dir, count, seed=seed, workers=workers, max_question=64, max_answer=1,
        progress=False,
    )  # fmt: skip
    out: dict[str, None] = {}  # ordered, distinct
    for chat in chats:
        # tokens: user prefix, question, end of turn (at start - turn), assistant header
        text = tok.decode(chat.tokens[: chat.start - turn], skip_special_tokens=False)
        if not text.startswith(USER_PREFIX):
            raise ValueError(f"{large_dir}: a conversation does not start with the user turn")
        if question := text.removeprefix(USER_PREFIX).strip():
            out[question] = None
    return list(out)
