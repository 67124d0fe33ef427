"""Questions a chat model writes itself, for `tokenrouterd train-router --prompts magpie`.

Magpie-style self-instruct without a list of questions: the model is given its own chat
template up to the start of a user turn and a first word (STARTERS, in turn: without one
nearly every question starts "Can you"), and writes the rest of the user's message,
sampled (seeded per question, top-k at temperature 1) on our `Engine`, until its end of
turn. A question that does not end within MAX_TOKENS, or repeats another, is dropped.
"""

from __future__ import annotations

from pathlib import Path

from trd.engines.engine import Engine
from trd.engines.spec import EngineSpec
from trd.frontend.openai_api import ChatTemplateArgs
from trd.frontend.tokens import PromptEncoder
from trd.protocol import FinishReason, SamplingParams

STARTERS = ("Can", "What", "How", "Write", "Why", "Explain", "Who", "Give", "I", "List", "Is",
            "Tell")  # fmt: skip
# The model's own temperature (diverse topics), from its top candidates (the far tail
# turns questions into word salad).
TEMPERATURE, TOP_K = 1.0, 40
MAX_TOKENS = 64
# The demo's 1.5B writes twice as fast in bfloat16 as in float32 on CPU (a model stored in
# float32 with no fast bfloat16 kernels here, e.g. SmolLM2, is the other way round).
DTYPE = "bfloat16"
# The user turn left open: the template renders the starter as the last message's text.
OPEN_TURN = ChatTemplateArgs(add_generation_prompt=False, continue_final_message=True)


def questions(model_dir: Path, count: int, *, seed: int, dtype: str = DTYPE) -> list[str]:
    """Up to `count` distinct questions, in seed order (question i draws from seed
    seed * 1_000_003 + i, so a seed's questions do not depend on `count`)."""
    encoder = PromptEncoder(model_dir)
    starters = [STARTERS[i % len(STARTERS)] for i in range(count)]
    prompts = [encoder.chat([{"role": "user", "content": s}], OPEN_TURN) for s in starters]
    kv = sum(len(p) + MAX_TOKENS for p in prompts)  # room for every question at once
    engine = Engine(EngineSpec.of(model_dir, dtype=dtype, kv_tokens=kv))
    starts: dict[int, str] = {}
    outputs: dict[int, list[int]] = {}
    for i, (starter, prompt) in enumerate(zip(starters, prompts, strict=True)):
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, top_k=TOP_K,
                                seed=seed * 1_000_003 + i)  # fmt: skip
        rid = engine.add_request(prompt, params)
        starts[rid], outputs[rid] = starter, []
    ended: set[int] = set()
    while engine.has_unfinished():
        for out in engine.step():
            if out.finish is FinishReason.ERROR:
                raise RuntimeError(f"{model_dir}: a question's request failed: {out.error}")
            outputs[out.rid].append(out.token)
            if out.finish is FinishReason.STOP:
                ended.add(out.rid)
    found: dict[str, None] = {}  # ordered, distinct
    for rid, starter in starts.items():
        if rid in ended and (text := (starter + encoder.decode(outputs[rid])).strip()):
            found[text] = None
    return list(found)
