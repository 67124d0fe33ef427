"""Every tensor a routing policy builds lives on the engine's device: on a GPU a CPU
tensor handed to a CUDA module (the engine's embedding, a router head) fails at the
engine's first step. Without a GPU: the engine's tensors sit on the `meta` device, and a
torch function mode fails any call that mixes two devices (meta accepts CPU operands
silently, so the mode is what tells)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from trd.engines.request import Request
from trd.policies.base import PolicyContext, RouteBatch, StepView
from trd.policies.factory import make_policy
from trd.policies.heads import save_random_head
from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams

HIDDEN, VOCAB, BATCH = 8, 16, 3
META = torch.device("meta")


class OneDevice(TorchFunctionMode):
    """Raises on any torch call whose tensor arguments are on more than one device (a
    0-dim CPU tensor, a Python scalar in disguise, is allowed with any device)."""

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        leaves, _ = tree_flatten((args, kwargs))
        devices = {
            t.device
            for t in leaves
            if isinstance(t, torch.Tensor) and not (t.device.type == "cpu" and t.dim() == 0)
        }
        if len(devices) > 1:
            raise AssertionError(f"{getattr(func, '__name__', func)} mixes devices {devices}")
        return func(*args, **kwargs)


def heads(tmp: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "rstitch", {"threshold": 0.5}
    yield "scripted", {"schedule": [1, 0]}
    yield "ensemble", {"weights": [1, 1]}
    for kind, inputs, top_k in (("citer", HIDDEN, 0), ("citer", HIDDEN + 5, 3),
                                ("collm", HIDDEN + 5, 3), ("r2r", 2 * HIDDEN + 3, 3)):  # fmt: skip
        path = save_random_head(tmp / f"{kind}{top_k}.safetensors", kind, inputs, 4, 0, top_k)
        yield kind, {"head": str(path)}


def test_the_harness_catches_a_cpu_tensor_handed_to_a_meta_module() -> None:
    embed = torch.nn.Embedding(VOCAB, HIDDEN, device=META)
    embed(torch.zeros(1, dtype=torch.long))  # passes silently without the mode
    with OneDevice(), pytest.raises(AssertionError, match="mixes devices"):
        embed(torch.zeros(1, dtype=torch.long))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_policies_build_and_route_on_the_engines_device(tmp_path: Path, dtype: torch.dtype) -> None:
    embed = torch.nn.Embedding(VOCAB, HIDDEN, device=META, dtype=dtype)
    view = StepView(
        torch.empty(BATCH, VOCAB, device=META),  # float32 logits, as the engine gives
        torch.empty(BATCH, HIDDEN, device=META, dtype=dtype),
        torch.zeros(BATCH, dtype=torch.long, device=META),
    )
    reqs = [Request(i, [3, 4], 2, SamplingParams(), 0.0) for i in range(BATCH)]
    checked = 0
    for name, params in heads(tmp_path):
        for model in (0, 1):
            with OneDevice():
                policy = make_policy(PolicySpec(name, params), PolicyContext(model, 2, embed))
                for _ in range(2):  # the first step moves a head to the device
                    routes = policy.route(reqs, view)
            if isinstance(routes, RouteBatch):
                assert routes.dst.device == META and routes.commit.device == META, name
                checked += 1
    assert checked >= 6  # every tensor policy on the entry model
