"""flashinfer's float workspace, sized from the model and its graph buckets (no GPU needed):
the sizes flashinfer 0.6's FA2 scheduler asks for, worked by hand for the largest bucket,
and the plan's reserve never below what an engine allocates on any GPU it may run on."""

from __future__ import annotations

import pytest

from trd.engines.buckets import GraphShape, graph_shapes
from trd.memplan.plan import GRAPH_SLACK_BYTES, activation_bytes, reserve_bytes
from trd.memplan.workspace import PLAN_SMS, float_workspace_bytes
from trd.models.checkpoint import ModelConfig

MIB = 1 << 20
H200_SMS = 132
SHAPES = graph_shapes((1, 2, 4, 8, 16, 24, 32, 48, 64), (2, 4, 8))  # the default buckets


def test_a_64_head_8_kv_head_model_needs_more_than_the_old_fixed_256_mib() -> None:
    # The extend graph (64, 8): 65 rows, 513 tokens, 8 query heads per KV head. Longest
    # row 449 tokens x 8 > 64 packed rows: cta 128; tiles ceil(513 x 8 / 128) + 64 = 97 >
    # 2 x 132 / 8 = 33 CTAs; 64 heads x 97 x 128 x (128 + 1) x 4 B + 32 = 410_026_016 B.
    assert float_workspace_bytes((64, 8, 128), [GraphShape(64, 8)], H200_SMS) == 392 * MIB
    assert float_workspace_bytes((64, 8, 128), [GraphShape(48, 8)], H200_SMS) > 256 * MIB
    assert float_workspace_bytes((64, 8, 128), SHAPES, H200_SMS) == 392 * MIB


@pytest.mark.parametrize(
    ("dims", "mib"),
    [
        ((16, 8, 128), 128),  # Qwen3-0.6B needs 74 MiB: flashinfer's recommended floor
        ((32, 8, 128), 164),  # Qwen3-8B
        ((28, 4, 128), 165),  # Qwen2.5-7B
        ((40, 8, 128), 215),  # Qwen3-14B
        ((64, 8, 128), 392),  # Qwen3-32B, Qwen2.5-72B, Llama-3-70B
    ],
)
def test_published_shapes_on_an_h200(dims: tuple[int, int, int], mib: int) -> None:
    assert float_workspace_bytes(dims, SHAPES, H200_SMS) == mib * MIB
    # Eager steps alone (graphs off) split within 2 x SMs / KV heads CTAs: far less.
    assert float_workspace_bytes(dims, (), H200_SMS) <= 134 * MIB


@pytest.mark.parametrize("sms", [108, 132, 148, 188])  # A100, H100/H200, B200, RTX PRO 6000
@pytest.mark.parametrize("dims", [(16, 8, 128), (64, 8, 128), (28, 4, 128), (8, 1, 256)])
def test_the_plan_covers_what_an_engine_allocates_on_any_gpu(
    sms: int, dims: tuple[int, int, int]
) -> None:
    for shapes in (SHAPES, ()):
        assert float_workspace_bytes(dims, shapes, sms) <= float_workspace_bytes(dims, shapes)
    assert sms <= PLAN_SMS


def test_the_plan_reserves_the_models_workspace() -> None:
    cfg = ModelConfig.from_dict(
        {"model_type": "qwen3", "num_hidden_layers": 64, "num_attention_heads": 64,
         "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120,
         "intermediate_size": 25600, "vocab_size": 151936},
        "qwen3-32b",
    )  # fmt: skip
    on = reserve_bytes(cfg, "cuda:0", 2048, SHAPES, 0)
    torch_attention = reserve_bytes(cfg, "cuda:0", 2048, SHAPES, 0, attention="torch")
    pool = activation_bytes(cfg, 513, 64) + 64 * 151936 * 4 + GRAPH_SLACK_BYTES
    assert on - torch_attention - pool == (392 + 8) * MIB  # float and int workspaces
