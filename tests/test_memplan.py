"""Memory plan: hand-computed KV capacities for small and Qwen3 models, refusals with numbers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trd.devices import GpuInfo
from trd.engines.buckets import graph_shapes
from trd.memplan import plan as plan_mod
from trd.memplan.plan import (
    GIB,
    ModelMem,
    PlanError,
    device_budget,
    plan_memory,
    reserve_bytes,
)
from trd.models.checkpoint import ModelConfig

MIB = 1 << 20
SHAPES = graph_shapes((1, 2, 4, 8, 16, 24, 32, 48, 64), (2, 4, 8))  # the default buckets

# --- (a) fixture-like small models -------------------------------------------

TINY = ModelConfig.from_dict(
    {"model_type": "qwen3", "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 16, "hidden_size": 64, "intermediate_size": 128,
     "vocab_size": 256},
    source="tiny",
)  # fmt: skip
SMALL = ModelConfig.from_dict(
    {"model_type": "qwen3", "num_hidden_layers": 4, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 32, "hidden_size": 128, "intermediate_size": 256,
     "vocab_size": 256},
    source="small",
)  # fmt: skip


def test_kv_bytes_and_reserve_by_hand() -> None:
    # 2 layers x 2 kv heads x 16 head dim x (K and V) x 4 bytes
    assert TINY.kv_bytes_per_token("float32") == 512
    # 4 x 2 x 32 x 2 x 2 bytes
    assert SMALL.kv_bytes_per_token("bfloat16") == 1024
    # CPU: 16 tokens x (4*64 + 2*128 + 256) x 4 bytes
    assert reserve_bytes(TINY, "cpu", 16) == 49152
    # CUDA adds flashinfer's workspaces (128 + 8 MiB: the float one's floor, 4 heads need
    # less), the CUDA context (512 MiB) and cuBLAS's workspaces (64 MiB): 712 MiB; the torch
    # attention has no workspaces
    assert reserve_bytes(TINY, "cuda:0", 16) == 49152 + 712 * MIB
    assert reserve_bytes(TINY, "cuda:0", 16, attention="torch") == 49152 + 576 * MIB
    # CUDA graphs: the pool of the largest graph, (64 x 8 + 1 tokens, 64 logits rows), as
    # an eager step of that size plus 64 float32 logits rows of output buffers, the
    # scratch page and 64 MiB of slack: 513 x (4*64 + 2*128) x 4 + 64 x 256 x 4 x 2 + 4096
    graphs = reserve_bytes(TINY, "cuda:0", 16, SHAPES, kv_bytes_per_page=4096)
    assert graphs - reserve_bytes(TINY, "cuda:0", 16) == 1_050_624 + 131_072 + 4096 + 64 * MIB
    assert reserve_bytes(TINY, "cpu", 16, SHAPES, kv_bytes_per_page=4096) == 49152
    # No graphs without flashinfer (they need it).
    torch_graphs = reserve_bytes(TINY, "cuda:0", 16, SHAPES, 4096, attention="torch")
    assert torch_graphs == reserve_bytes(TINY, "cuda:0", 16, attention="torch")


def _two_small_models() -> list[ModelMem]:
    return [
        ModelMem("tiny", "cpu", 1_000_000, 512, reserve_bytes(TINY, "cpu", 16)),
        ModelMem("small", "cpu", 3_000_000, 2048, reserve_bytes(SMALL, "cpu", 16)),
    ]


def test_plan_small_models_share_one_capacity() -> None:
    # fixed = 1_000_000 + 49_152 + 3_000_000 + 16*(512+512+256)*4 (= 81_920) = 4_131_072
    # room  = 8 MiB - fixed = 8_388_608 - 4_131_072 = 4_257_536
    # K     = 4_257_536 // (512 + 2048) = 1663 -> down to pages of 16: 1648 (103 pages)
    plan = plan_memory(_two_small_models(), {"cpu": 8 * MIB}, page_size=16, min_tokens=1000)
    assert [(m.name, m.kv_tokens, m.pages, m.kv_bytes) for m in plan.models] == [
        ("tiny", 1648, 103, 1648 * 512),
        ("small", 1648, 103, 1648 * 2048),
    ]
    (dev,) = plan.devices
    assert (dev.device, dev.budget_bytes, dev.used_bytes) == ("cpu", 8 * MIB, 8_349_952)
    assert json.loads(json.dumps(plan.to_dict()))["models"][1] == {
        "name": "small", "device": "cpu", "weight_bytes": 3_000_000, "kv_bytes_per_token": 2048,
        "reserve_bytes": 81_920, "kv_tokens": 1648, "pages": 103, "kv_bytes": 3_375_104,
        "quantization": "none", "unquantized_bytes": 0,
    }  # fmt: skip
    assert plan.to_table() == (
        "model  device  weights GiB  KV B/token  reserve GiB  KV tokens  pages  KV GiB\n"
        "tiny   cpu            0.00         512         0.00       1648    103    0.00\n"
        "small  cpu            0.00        2048         0.00       1648    103    0.00\n"
        "\n"
        "device  budget GiB  used GiB\n"
        "cpu           0.01      0.01"
    )


def test_min_tokens_rounds_up_to_whole_pages() -> None:
    models = _two_small_models()
    # 1648 tokens fit; 1649 needs 104 pages = 1664 tokens, 16 more than there is room for.
    plan_memory(models, {"cpu": 8 * MIB}, page_size=16, min_tokens=1648)
    with pytest.raises(PlanError, match="room for 1648 KV tokens"):
        plan_memory(models, {"cpu": 8 * MIB}, page_size=16, min_tokens=1649)


def test_devices_are_planned_independently() -> None:
    models = [
        ModelMem("a", "cpu", 1000, 10, 0),
        ModelMem("b", "cuda:0", 1000, 10, 0),
        ModelMem("c", "cuda:0", 1000, 30, 0),
    ]
    # cpu: (5000 - 1000) // 10 = 400; cuda:0: (5000 - 2000) // 40 = 75 -> 72 (pages of 8)
    plan = plan_memory(models, {"cpu": 5000, "cuda:0": 5000}, page_size=8, min_tokens=8)
    assert [(m.name, m.kv_tokens, m.pages) for m in plan.models] == [
        ("a", 400, 50),
        ("b", 72, 9),
        ("c", 72, 9),
    ]
    assert [(d.device, d.used_bytes) for d in plan.devices] == [("cpu", 5000), ("cuda:0", 4880)]


def test_plan_rejects_missing_budget_and_duplicate_names() -> None:
    with pytest.raises(ValueError, match=r"no memory budget for device\(s\) \['cuda:1'\]"):
        plan_memory([ModelMem("a", "cuda:1", 1, 1, 0)], {"cpu": 10}, 1, 1)
    with pytest.raises(ValueError, match="unique"):
        plan_memory([ModelMem("a", "cpu", 1, 1, 0)] * 2, {"cpu": 10}, 1, 1)


# --- (b) Qwen3-0.6B + Qwen3-32B on an 80 GiB GPU ------------------------------

QWEN3_06B = {
    "model_type": "qwen3", "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 1024, "intermediate_size": 3072,
    "vocab_size": 151936,
    "tie_word_embeddings": True, "max_position_embeddings": 40960,
}  # fmt: skip
QWEN3_32B = {
    "model_type": "qwen3", "num_hidden_layers": 64, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120, "intermediate_size": 25600,
    "vocab_size": 151936,
    "tie_word_embeddings": False, "max_position_embeddings": 40960,
}  # fmt: skip


def qwen3_params(c: dict[str, Any]) -> int:
    """Parameters of a Qwen3 dense model, from its config."""
    h, hd, inter = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    attention = h * q + 2 * h * kv + q * h + 2 * hd  # q/k/v/o projections, q_norm, k_norm
    mlp = 3 * h * inter  # gate, up, down
    layer = attention + mlp + 2 * h  # input and post-attention RMSNorm
    embeddings = c["vocab_size"] * h * (1 if c["tie_word_embeddings"] else 2)  # + lm_head
    return embeddings + c["num_hidden_layers"] * layer + h  # + final norm


def _qwen_models() -> list[ModelMem]:
    models = []
    for name, config in (("qwen3-0.6b", QWEN3_06B), ("qwen3-32b", QWEN3_32B)):
        shape = ModelConfig.from_dict(config, name)
        models.append(
            ModelMem(
                name,
                "cuda:0",
                qwen3_params(config) * 2,
                shape.kv_bytes_per_token("bfloat16"),
                reserve_bytes(shape, "cuda:0", max_batch_tokens=2048),
            )
        )
    return models


def test_qwen3_parameter_counts() -> None:
    # 0.6B: 151936*1024 + 28 * 15_730_944 + 1024 (tied embeddings)
    assert qwen3_params(QWEN3_06B) == 596_049_920
    # 32B: 2 * 151936*5120 + 64 * 487_598_336 + 5120 (untied lm_head)
    assert qwen3_params(QWEN3_32B) == 32_762_123_264


def test_qwen3_pair_fits_80_gib_at_bf16() -> None:
    small, large = _qwen_models()
    assert (small.weight_bytes, small.kv_bytes_per_token) == (1_192_099_840, 114_688)
    assert (large.weight_bytes, large.kv_bytes_per_token) == (65_524_246_528, 262_144)
    # R = 2048 tokens x (4h + 2I + vocab) x 4 B + flashinfer's float workspace + 8 MiB
    # + 512 MiB context + 64 MiB cuBLAS. The eager workspace (no graphs here) for PLAN_SMS
    # = 192: heads x (2 x 192 / 8 KV heads) x 128 x 129 x 4 B: 0.6B 48 MiB -> the 128 MiB
    # floor; 32B 193.5 -> 194 MiB.
    assert small.reserve_bytes == 2048 * 162_176 * 4 + 712 * MIB == 2_075_131_904
    assert large.reserve_bytes == 2048 * 223_616 * 4 + 778 * MIB == 2_647_654_400
    # fixed = W + R of both = 71_439_132_672; room = 80 GiB - fixed = 14_460_213_248
    # K = 14_460_213_248 // (114_688 + 262_144) = 38_373 -> pages of 16: 38_368 (2398 pages)
    plan = plan_memory([small, large], {"cuda:0": 80 * GIB}, page_size=16, min_tokens=32768)
    assert [(m.kv_tokens, m.pages) for m in plan.models] == [(38_368, 2398), (38_368, 2398)]
    assert plan.devices[0].used_bytes == 71_439_132_672 + 38_368 * 376_832
    assert plan.to_table().splitlines()[1:3] == [
        "qwen3-0.6b  cuda:0         1.11      114688         1.93      38368   2398    4.10",
        "qwen3-32b   cuda:0        61.02      262144         2.47      38368   2398    9.37",
    ]


def test_qwen3_pair_at_full_context_is_refused_with_numbers() -> None:
    # One 40_960-token request per model needs (0.6B) 1_192_099_840 + 40_960*114_688
    # + 2_075_131_904 = 7.42 GiB and (32B) 65_524_246_528 + 40_960*262_144
    # + 2_647_654_400 = 73.49 GiB: 80.91 GiB in all, more than a 79.00 budget.
    with pytest.raises(PlanError) as info:
        plan_memory(_qwen_models(), {"cuda:0": 79 * GIB}, page_size=16, min_tokens=40960)
    message = str(info.value)
    for needle in (
        "qwen3-0.6b  cuda:0         1.11      114688         1.93       79.00        7.42",
        "qwen3-32b   cuda:0        61.02      262144         2.47       79.00       73.49",
        "cuda:0: needs at least 80.91 GiB for 40960 KV tokens per model, budget is 79.00 GiB",
        "(room for 35520 KV tokens)",
        "lower max_model_len",
        "memory.budget_gib",
    ):
        assert needle in message


# --- device budgets -----------------------------------------------------------


def test_device_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [GpuInfo(0, "A", 100, 80), GpuInfo(1, "B", 100, 60)]
    monkeypatch.setattr(plan_mod.devices, "probe_gpus", lambda: gpus)
    monkeypatch.setattr(plan_mod.devices, "available_ram_bytes", lambda: 1000)
    assert device_budget("cuda:1", 1.5, 0.9) == 1_610_612_736  # configured GiB wins
    assert device_budget("cuda:1", None, 0.5) == 30
    assert device_budget("cuda", None, 0.5) == 40
    assert device_budget("cpu", None, 0.25) == 250
    with pytest.raises(ValueError, match="NVML reports no such GPU"):
        device_budget("cuda:2", None, 0.5)
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        device_budget("tpu", None, 0.5)
