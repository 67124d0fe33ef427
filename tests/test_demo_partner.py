"""The demo's partner model, built with a tiny budget from the imported SmolLM2-135M.

The full build (minutes) is not run here; a few conversations and a few training steps
exercise the same code: teacher chats on our engine, distillation, saving.
"""

from __future__ import annotations

import filecmp
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import trd.routers.prompts as routerkit_prompts
from trd.demo import distil, teacher
from trd.demo.large import ensure_large
from trd.demo.partner import LAYERS, TOKENIZER_FILES, Budget, build_partner, slice_of
from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.protocol import SamplingParams

CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache"

TINY = Budget(conversations=4, max_question=24, max_answer=12, steps=3, batch=2, lr=3e-3)


@pytest.fixture(scope="module")
def large() -> Path:
    return ensure_large(CACHE_DIR)


@pytest.fixture(scope="module")
def partner(large: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_partner(large, tmp_path_factory.mktemp("partner") / "small", TINY, progress=False)


@pytest.fixture(scope="module")
def chats(large: Path) -> list[teacher.Example]:
    return teacher.converse(large, [0, 1, 2, 3], max_question=32, max_answer=12, progress=False)


def chat_prompt(model_dir: Path, question: str) -> list[int]:
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return tok.encode(text, add_special_tokens=False)


def test_partner_serves_in_our_engine_as_in_transformers(partner: Path) -> None:
    prompt = chat_prompt(partner, "What is the capital of France?")
    ours = Engine(EngineSpec.of(partner, dtype="float32")).generate(
        [prompt], SamplingParams(max_tokens=12)
    )[0]
    model = AutoModelForCausalLM.from_pretrained(partner, dtype=torch.float32).eval()
    assert model.config.model_type == "llama"
    assert model.config.num_hidden_layers == LAYERS
    assert next(model.parameters()).dtype == torch.float32
    out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    theirs = out[0, len(prompt) :].tolist()
    assert ours == theirs[: len(ours)] and len(ours) >= 1


def test_the_build_is_reproducible(
    partner: Path, large: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    again = build_partner(large, tmp_path_factory.mktemp("again") / "small", TINY, progress=False)
    assert filecmp.cmp(partner / "model.safetensors", again / "model.safetensors", shallow=False)


def test_partner_has_the_large_models_tokenizer_files(partner: Path, large: Path) -> None:
    present = [name for name in TOKENIZER_FILES if (large / name).is_file()]
    assert "tokenizer.json" in present
    for name in present:
        assert filecmp.cmp(large / name, partner / name, shallow=False), name


def _median_step_ms(engine: Engine, steps: int = 24) -> float:
    engine.add_request(list(range(100, 132)), SamplingParams(max_tokens=steps, ignore_eos=True))
    engine.step()  # the prompt
    times = []
    while engine.has_unfinished():
        start = time.process_time()  # CPU time: a busy machine does not skew the ratio
        engine.step()
        times.append(time.process_time() - start)
    return 1e3 * sorted(times)[len(times) // 2]


def test_partner_decode_step_is_much_cheaper(partner: Path, large: Path) -> None:
    small_ms = _median_step_ms(Engine(EngineSpec.of(partner, dtype="float32", kv_tokens=1024)))
    large_ms = _median_step_ms(Engine(EngineSpec.of(large, dtype="float32", kv_tokens=1024)))
    # The full build is sized for a quarter of the large model's step; half leaves room
    # for a noisy machine while still failing if the partner kept most of the layers.
    assert small_ms < 0.5 * large_ms, (small_ms, large_ms)


def test_teacher_targets_are_the_distributions_that_chose_the_answers(
    chats: list[teacher.Example], large: Path
) -> None:
    """Targets start right after the assistant header; each answer token was the argmax."""
    assert chats
    tok = AutoTokenizer.from_pretrained(large)
    for ex in chats:
        n = len(ex.top_ids)
        assert ex.top_ids.shape == ex.top_logp.shape == (n, teacher.TOP_K)
        head = tok.decode(ex.tokens[: ex.start + 1], skip_special_tokens=False)
        assert isinstance(head, str)  # one sequence of ids decodes to one string
        assert head.endswith("<|im_start|>assistant\n")
        answer = torch.tensor(ex.tokens[ex.start + 1 : ex.start + 1 + n])
        assert len(answer) == n >= 1
        hit = ex.top_ids == answer[:, None]
        assert hit.sum(1).eq(1).all()  # every answer token is among the kept top-k
        assert torch.equal(ex.top_logp[hit], ex.top_logp[:, 0])  # ... and was the greedy pick
        assert (ex.top_logp.exp().sum(1) <= 1 + 1e-4).all()


def test_router_training_questions_are_the_large_models_own(large: Path) -> None:
    """`teacher.questions` (train-router's magpie prompts): the user turn's text alone,
    distinct, rendered back through the chat template as a prompt ending in the header."""
    qs = teacher.questions(large, 4, seed=5, workers=2)
    assert 1 <= len(qs) == len(set(qs)) <= 4
    for q in qs:
        assert q == q.strip() and q and "<|im_" not in q and teacher.SYSTEM not in q
    ids = routerkit_prompts.prompts("magpie", large, 2, large)
    assert len(ids) == 2  # of 3 asked for (seeded: each ends within 64 tokens)
    tok = AutoTokenizer.from_pretrained(large)
    for p in ids:
        text = tok.decode(p, skip_special_tokens=False)
        assert isinstance(text, str)
        assert text.startswith(teacher.USER_PREFIX) and text.endswith("<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="large model"):
        routerkit_prompts.prompts("magpie", large, 2)


def test_distillation_moves_the_slice_toward_the_teacher(
    chats: list[teacher.Example], large: Path
) -> None:
    torch.manual_seed(0)
    model = slice_of(large, LAYERS)
    weight = distil.output_weight(model)
    batch = distil.collate(chats, pad_id=2)

    def kl() -> float:
        with torch.no_grad():
            logits = distil.student_logits(model, batch, weight)
            return distil.kl_loss(logits, batch.top_ids, batch.top_logp).item()

    before = kl()
    distil.distil(model, chats, steps=12, batch=2, lr=3e-3, seed=0, pad_id=2, progress=False)
    assert kl() < 0.7 * before
