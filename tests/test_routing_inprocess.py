"""Routing engines wired in one process: every interleaving, duplicates and reorders.

The engines talk through the real codec but through Python queues, so the test can
choose any interleaving of steps and deliveries, and inject duplicated, reordered and
late messages, to the peers and to the front end. Outputs must equal the reference loop
exactly (float64), and the front end must have seen (and ignored) the duplicate Emits.
Also with models whose embedding matrices are padded differently (one tokenizer).
"""

from __future__ import annotations

import itertools
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from trd.engines.loop import stats_body
from trd.protocol import FinishReason, SamplingParams
from trd.testing.tinymodels.tokenizer import VOCAB_SIZE
from trd.testing.wiring import Wiring, assert_matches

from routing_cases import (
    INPROCESS_CASES,
    MODEL_SETS,
    jobs,
    prompts,
    reference,
    shared_prefix_jobs,
    specs,
    wired,
)

CASE_IDS = [f"{c[0]}-{c[2]}" for c in INPROCESS_CASES]
# Prefill ahead is the engines' mechanism, not a policy's rule: per commit one case (three
# models, scripted: both later models prefill ahead and take handoffs both ways); every
# policy in the slow tier.
AHEAD_PER_COMMIT = "scripted-3"
AHEAD_CASES = [
    pytest.param(*case, id=name, marks=() if name == AHEAD_PER_COMMIT else pytest.mark.slow)
    for case, name in zip(INPROCESS_CASES, CASE_IDS, strict=True)
]


@pytest.mark.parametrize("policy,params,n_models", INPROCESS_CASES, ids=CASE_IDS)
def test_interleavings_match_the_reference(
    tiny_models: dict[str, Path], policy: str, params: dict, n_models: int
) -> None:
    paths = [tiny_models[n] for n in MODEL_SETS[n_models]]
    work = jobs(paths[0])[2:10]  # the short ones: interleavings matter here, not length
    expected = reference(paths, policy, params, work)
    wiring = wired(paths, policy, params, seed=n_models)
    wiring.run(work)
    assert_matches(wiring, expected)
    assert wiring.injected > 0
    assert sum(g.duplicates for g in wiring.tracked.values()) > 0  # Emits came twice, ignored


@pytest.mark.parametrize("policy,params,n_models", INPROCESS_CASES, ids=CASE_IDS)
def test_shared_prefixes_come_from_the_cache_and_match_the_reference(
    tiny_models: dict[str, Path], policy: str, params: dict, n_models: int
) -> None:
    """With the prefix cache (on by default), at 1, 4 and 16 requests in flight: the
    reference's tokens, and every token of a shared prefix fed once per engine or taken
    from its cache (assert_matches counts both)."""
    paths = [tiny_models[n] for n in MODEL_SETS[n_models]]
    work = shared_prefix_jobs(paths[0])
    expected = reference(paths, policy, params, work)
    for concurrency in (1, 4, 16):
        wiring = wired(paths, policy, params, seed=10 * n_models + concurrency)
        wiring.run(work, concurrency)
        assert_matches(wiring, expected)
        assert wiring.hits()[0] >= 40 * (len(work) - 2)  # the head, for all but the first


def test_an_engine_expects_a_return_while_its_request_is_away(
    tiny_models: dict[str, Path],
) -> None:
    """What lets an idle engine poll instead of sleep: a request of its own at a peer."""
    paths = [tiny_models["small"], tiny_models["large"]]
    wiring = wired(paths, "scripted", {"schedule": [1, 0]}, seed=0)
    small, large = wiring.engines
    prompt, sp = jobs(paths[0])[2]
    wiring.submit(0, prompt, sp)
    assert not small.expects_return() and not large.expects_return()
    for msg in wiring.inbox[0]:
        small.inbox.handle(msg)
    wiring.inbox[0].clear()
    small.step()  # position 0 belongs to the large model: hand off
    assert small.expects_return() and not large.expects_return()
    for msg in wiring.inbox[1]:
        large.inbox.handle(msg)
    wiring.inbox[1].clear()
    large.step()  # commits position 0, hands position 1 back
    assert large.expects_return()
    for msg in wiring.inbox[0]:
        small.inbox.handle(msg)
    assert not small.expects_return()  # back and runnable: nothing of its own away


def test_a_request_that_fills_the_context_survives_a_handoff(tiny_models: dict[str, Path]) -> None:
    # The peer counted the committed output as prompt, so prompt + max_tokens == context
    # (the chat default: max_tokens = what the context leaves) failed at the first handoff.
    paths = [tiny_models["small"], tiny_models["large"]]
    wiring = wired(paths, "scripted", {"schedule": [0, 0, 1]}, seed=0, max_model_len=32)
    wiring.submit(0, list(range(5, 13)), SamplingParams(max_tokens=24, ignore_eos=True))
    for _ in range(20000):
        if wiring.tracked[0].complete:
            break
        wiring.tick()
    got = wiring.tracked[0]
    assert (got.finish, got.error, len(got.tokens)) == (FinishReason.LENGTH, "", 24)
    assert set(got.models) == {0, 1}


PAD_ROWS = 64


@pytest.fixture(scope="module")
def padded_small(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture small, its (tied) embedding padded from 2048 to 2048 + 64 rows, as
    Qwen pads 151665 ids to 151936 rows. Each padding row is twice the row of one of the
    corpus's 64 commonest tokens, so unmasked it would outscore that token wherever the
    token's logit is positive: padding that greedy decoding would pick, if it could."""
    out = tmp_path_factory.mktemp("padded") / "small"
    shutil.copytree(tiny_models["small"], out)
    weights = load_file(out / "model.safetensors")
    embed = weights["model.embed_tokens.weight"]
    counts = Counter(t for p in prompts(out, 64) for t in p)
    common = torch.tensor([t for t, _ in counts.most_common(PAD_ROWS)])
    weights["model.embed_tokens.weight"] = torch.cat([embed, 2 * embed[common]])
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "vocab_size": VOCAB_SIZE + PAD_ROWS}))
    return out


PADDED_CASES = [("rstitch", {"threshold": 0.78}), ("scripted", {"schedule": [1, 0, 0, 1, 1, 0]})]


@pytest.mark.parametrize("policy,params", PADDED_CASES)
def test_padded_vocabularies_route_exactly_and_never_emit_padding(
    tiny_models: dict[str, Path], padded_small: Path, policy: str, params: dict
) -> None:
    paths = [padded_small, tiny_models["large"]]  # 2112 and 2048 rows, one tokenizer
    work = jobs(paths[0])[2:8]
    ref = AutoModelForCausalLM.from_pretrained(padded_small, dtype=torch.float64).eval()
    with torch.no_grad():
        raw = ref(torch.tensor([work[0][0]])).logits[0]
    assert raw.shape[1] == VOCAB_SIZE + PAD_ROWS and (raw.argmax(-1) >= VOCAB_SIZE).any()
    expected = reference(paths, policy, params, work)
    wiring = wired(paths, policy, params, seed=5)
    wiring.run(work)
    assert_matches(wiring, expected)
    outputs = [t for g in wiring.tracked.values() for t in g.tokens]
    assert outputs and max(outputs) < VOCAB_SIZE
    switches = {(a, b) for g in wiring.tracked.values() for a, b in itertools.pairwise(g.models)}
    assert {(0, 1), (1, 0)} <= switches  # handoffs both ways


@pytest.mark.parametrize("policy,params,n_models", AHEAD_CASES)
def test_prefill_ahead_matches_the_reference(
    tiny_models: dict[str, Path], policy: str, params: dict, n_models: int
) -> None:
    """engine.prefill_ahead on: every prompt is prefilled on the other models as it
    arrives; their handoffs, before or after that prefill ends, still give the
    reference's tokens at 1, 4 and 16 in flight, feed nothing twice (what a prefill ahead
    fed counts as cache hits of the request that comes), and leave every page free."""
    paths = [tiny_models[n] for n in MODEL_SETS[n_models]]
    work = shared_prefix_jobs(paths[0]) + jobs(paths[0])[8:16]
    expected = reference(paths, policy, params, work)
    adopted = 0
    for concurrency in (1, 4, 16):
        wiring = wired(paths, policy, params, seed=20 * n_models + concurrency,
                       prefill_ahead=True, max_batch_tokens=32)  # fmt: skip
        wiring.run(work, concurrency)
        assert_matches(wiring, expected)
        taken = [e.stats.prefills_ahead for e in wiring.engines]
        assert taken[0] == 0 and all(t > 0 for t in taken[1:]), taken
        adopted += sum(e.stats.prefills_adopted for e in wiring.engines)
    assert adopted > 0  # some handoffs came while their prompt's prefill ran


def test_status_counts_a_prefill_ahead_apart_from_requests(tiny_models: dict[str, Path]) -> None:
    """Status (trctl, /metrics) of the large engine while a prefill ahead is there: the
    running and waiting counts (requests only, the queue-depth gauge) leave it out,
    `prefilling_ahead` counts it until it has run."""
    paths = [tiny_models[n] for n in MODEL_SETS[2]]
    engine_specs = specs(paths, "scripted", {"schedule": [1]}, prefill_ahead=True,
                         max_batch_tokens=16)  # fmt: skip
    wiring = Wiring(engine_specs)
    prompt, _ = shared_prefix_jobs(paths[0])[0]  # four whole blocks and a token
    wiring.submit(0, prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    status = [lambda i=i: json.loads(stats_body(engine_specs[i], wiring.engines[i]))
              for i in range(2)]  # fmt: skip
    for i, engine in enumerate(wiring.engines):
        for msg in wiring.inbox[i]:
            engine.inbox.handle(msg)
    small, large = status[0](), status[1]()
    assert (small["waiting"], small["prefilling_ahead"]) == (1, 0)
    assert (large["running"], large["waiting"], large["prefilling_ahead"]) == (0, 0, 1)
    wiring.engines[1].step()  # one block of four: still there, and running now
    large = status[1]()
    assert (large["running"], large["waiting"], large["prefilling_ahead"]) == (0, 0, 1)
    while wiring.engines[1].engine.has_unfinished():
        wiring.engines[1].step()
    large = status[1]()
    assert (large["prefilling_ahead"], large["prefills_ahead"]) == (0, 1)
    assert large["prefix_cache"]["cached_pages"] == 4


@pytest.mark.parametrize("after", ["handoff", "end"])
@pytest.mark.parametrize("long", [True, False])
def test_a_prompt_that_comes_after_its_request_is_not_prefilled_ahead(
    tiny_models: dict[str, Path], after: str, long: bool
) -> None:
    """The Submit to a prefill-ahead engine and the request's first handoff travel by
    different links (remote engines): when the handoff, or even the request's end, comes
    first, the Submit changes nothing and counts as `prefills_late`, if it was long enough
    to prefill ahead (more than a block) at all."""
    paths = [tiny_models[n] for n in MODEL_SETS[2]]
    policy = {"schedule": [1, 0]}
    wiring = Wiring(specs(paths, "scripted", policy, prefill_ahead=True))
    prompt = shared_prefix_jobs(paths[0])[0][0]
    page = wiring.engines[1].engine.scheduler.cache.page_size  # type: ignore[union-attr]
    assert len(prompt) > page
    job = prompt if long else prompt[:page], SamplingParams(max_tokens=6, ignore_eos=True)
    wiring.submit(0, *job)
    late = wiring.inbox[1].pop()  # held back
    assert wiring.inbox[1] == []
    gen = wiring.tracked[0]

    def arrived() -> bool:
        return bool(wiring.engines[1].requests)

    def ended() -> bool:
        return gen.complete and gen.all_done and not any(e.requests for e in wiring.engines)

    for _ in range(1000):
        if arrived() if after == "handoff" else ended():
            break
        wiring.tick()
    assert arrived() == (after == "handoff") and ended() == (after == "end")
    wiring.inbox[1].append(late)
    while not ended():
        wiring.tick()
    wiring.tick()  # the Submit, if it is still there
    assert_matches(wiring, reference(paths, "scripted", policy, [job]))
    large = wiring.engines[1].stats
    assert (large.prefills_ahead, large.prefills_late) == (0, int(long))
    assert {1, 0} <= set(gen.models)
