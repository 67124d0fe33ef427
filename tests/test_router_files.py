"""Router files: R2R's published format against a reference of their module
(tests/r2r_reference.py); our heads' pair identity. Every refusal names `policy.head`
and says why."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from trd.config import ConfigError, from_dict
from trd.engines.request import Request
from trd.policies.base import PolicyContext, StepView, host_routes
from trd.policies.factory import make_policy
from trd.policies.heads import save_head
from trd.policies.pair import PairIdentity
from trd.policies.params import PolicyError, PolicySpec
from trd.protocol import SamplingParams
from trd.supervisor.group import EngineGroup, EngineStartError
from trd.testing.wiring import assert_matches

from r2r_reference import HIDDEN, TOP, VOCAB, HiddenStatesTokenLMHeadLogitsClassifier, build
from routing_cases import jobs, reference, specs, wired


def r2r_policy(
    path: Path, module: HiddenStatesTokenLMHeadLogitsClassifier, params: dict | None = None
) -> Any:
    ctx = PolicyContext(0, 2, module.token_embeddings)
    return make_policy(PolicySpec("r2r", {"head": str(path), **(params or {})}), ctx)


@pytest.mark.parametrize(("dims", "normalize"), [([96] * 6, False), ([96, 64, 48], True)])
def test_published_router_scores_equal_their_module(
    tmp_path: Path, dims: list[int], normalize: bool
) -> None:
    path = tmp_path / "router.pt"
    module = build(path, dims, normalize).double()
    policy = r2r_policy(path, module)
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(9, VOCAB, generator=gen, dtype=torch.float64) * 3
    hidden = torch.randn(9, HIDDEN, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, VOCAB, (9,), generator=gen)
    with torch.no_grad():
        want = torch.sigmoid(module(hidden, tokens, torch.topk(logits, TOP).values)).squeeze(-1)
    got = policy.scores(StepView(logits, hidden, tokens))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert float(want.std()) > 0.05  # scores spread: a wrong layer would show
    # No threshold in the config: the file's (route to the large model at sigmoid >= it).
    tau = float(want.median())
    policy = r2r_policy(path, build(path, dims, normalize, threshold=tau).double())
    reqs = [Request(i, [1], 1, SamplingParams(), 0.0) for i in range(9)]
    routes = host_routes(policy.route(reqs, StepView(logits, hidden, tokens)))
    assert [(r.dst, r.commit) for r in routes] == [(1, False) if w >= tau else (0, True)
                                                   for w in want.tolist()]  # fmt: skip
    assert sum(r.dst for r in routes) == 5


def test_published_router_runs_in_the_engines_like_the_reference(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """The router as the entry engine's batched op: tokens and producers equal the
    reference loop's, with duplicated and reordered handoffs (float64)."""
    paths = [tiny_models["small"], tiny_models["large"]]
    path = tmp_path / "router.pt"
    build(path, [96] * 6, normalize=True, threshold=0.6, seed=3)
    params = {"head": str(path)}  # the file's threshold
    work = jobs(paths[0])[2:8]
    expected = reference(paths, "r2r", params, work)
    assert {m for t in expected for m in t.models} == {0, 1}
    wiring = wired(paths, "r2r", params, seed=7)
    wiring.run(work)
    assert_matches(wiring, expected)


class NotAllowed:
    """Any class: a weights-only load refuses to build it."""


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "LogitsClassifier"}, "model_type 'LogitsClassifier': only Hidden"),
        ({"state_dict": lambda sd: {k: v for k, v in sd.items() if "blocks.2.mlp.3" not in k}},
         r"missing tensor 'backbone.blocks.2.mlp.3.weight'"),
        ({"state_dict": lambda sd: {**sd, "combined_projection.weight": torch.zeros(96, 190)}},
         r"'combined_projection.weight' has shape \(96, 190\), the layout of init_args needs"),
        ({"state_dict": lambda sd: {**sd, "extra.weight": torch.zeros(1)}}, "unexpected tensors"),
        ({"init_args": lambda a: {**a, "use_position_embedding": True}}, "not supported"),
        ({"common_args": {"threshold": 2.0}}, r"common_args.threshold 2.0"),
        ({"model_specific_args": NotAllowed()}, "not a weights-only torch file"),
    ],
)  # fmt: skip
def test_malformed_router_files_are_refused(tmp_path: Path, change: dict, message: str) -> None:
    path = tmp_path / "router.pt"
    module = build(path, [96] * 6, **change)
    with pytest.raises(PolicyError, match=rf"policy.head: '{path}': .*{message}"):
        r2r_policy(path, module)


def test_truncated_router_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "router.pt"
    module = build(path, [96] * 6)
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(PolicyError, match=r"policy.head: .*not a weights-only torch file"):
        r2r_policy(path, module)
    pickled = tmp_path / "pickled.pt"
    pickled.write_bytes(pickle.dumps({"model_type": "x"}))  # not torch.save's zip
    with pytest.raises(PolicyError, match=r"policy.head"):
        r2r_policy(pickled, module)


def test_another_pairs_router_fails_the_engine_at_start(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    path = tmp_path / "router.pt"
    build(path, [32] * 2, hidden=128)  # made for a small model of hidden size 128
    paths = [tiny_models["small"], tiny_models["large"]]
    group = EngineGroup(specs(paths, "r2r", {"head": str(path)}, kv_tokens=1024))
    want = r"engine 'small' failed to start: policy.head: .*hidden size 128, this one has 64"
    with pytest.raises(EngineStartError, match=want + ": a router of another model pair"):
        group.start(timeout=120)


def head_for(tmp_path: Path, small: Path, large: Path, name: str = "citer") -> Path:
    w = torch.zeros(1, HIDDEN)
    return save_head(tmp_path / f"{name}.safetensors", name, [(w, torch.zeros(1))],
                     threshold=0.4, pair=PairIdentity.of(small, large))  # fmt: skip


def config(models: dict[str, Path], names: list[str], policy: dict) -> dict:
    return {
        "device": "cpu", "mps": "off",
        "models": [{"name": n, "path": str(models[n]), "dtype": "float32"} for n in names],
        "policy": policy,
    }  # fmt: skip


def test_a_head_of_another_pair_is_refused_at_start(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    head = head_for(tmp_path, tiny_models["small"], tiny_models["large"])
    policy = {"name": "citer", "head": str(head)}
    from_dict(config(tiny_models, ["small", "large"], policy), tmp_path)  # its own pair: fine
    with pytest.raises(ConfigError, match=rf"policy.head: '{head}': trained for the pair "
                       r"small\+large .*, not this config's small\+mid .*the large model "
                       r"\(\w+ here, \w+ in the head\) differ"):  # fmt: skip
        from_dict(config(tiny_models, ["small", "mid"], policy), tmp_path)
    with pytest.raises(ConfigError, match=r"the small model .* differ"):
        from_dict(config(tiny_models, ["mid", "large"], policy), tmp_path)


def test_the_entry_engine_checks_its_own_half_of_the_pair(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Engines built without the config (benchmarks, tests) still refuse another small."""
    head = head_for(tmp_path, tiny_models["small"], tiny_models["large"])
    embed = nn.Embedding(VOCAB, HIDDEN)
    spec = PolicySpec("citer", {"head": str(head)})
    policy = make_policy(spec, PolicyContext(0, 2, embed, tiny_models["small"]))
    assert policy.threshold == pytest.approx(0.4)  # the head's, the config gave none
    with pytest.raises(PolicyError, match=r"policy.head: .*trained with the small model of the "
                       r"pair small\+large, not with .*mid"):  # fmt: skip
        make_policy(spec, PolicyContext(0, 2, embed, tiny_models["mid"]))


def test_the_large_engine_reports_a_threshold_once_it_has_one(
    tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """Only the entry engine reads the head: the other reports none until one is set
    (what the share control's confirmation waits for)."""
    head = head_for(tmp_path, tiny_models["small"], tiny_models["large"])
    spec = PolicySpec("citer", {"head": str(head)})
    large = make_policy(spec, PolicyContext(1, 2, nn.Embedding(VOCAB, HIDDEN)))
    assert large.threshold is None
    large.set_threshold(0.25)
    assert large.threshold == 0.25
