"""The joint memory plan: one KV capacity shared by every model on a device.

Every model on a device holds its weights W_i, a KV cache of K tokens at v_i
bytes each, and a reserve R_i for activations and workspaces. The plan picks
the largest K (a whole number of pages) with

    sum_i (W_i + K * v_i + R_i) <= G_device

so that a request handed from one model to another always finds room for its
whole context on the receiving model. It refuses, with the numbers, when K
cannot hold even one request of the minimum length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from trd import devices
from trd.memplan.workspace import GraphSize, float_workspace_bytes
from trd.models.checkpoint import Checkpoint, ModelConfig

GIB = 1 << 30
MIB = 1 << 20

# On CUDA each engine holds, besides weights, KV and activations (the numbers are
# checked on a GPU by scripts/gpu_check.sh, which compares them with what it measures):
# with the flashinfer backend, its float workspace (workspace.py: sized from the model's
# heads and the graph buckets) and its int workspace (the size its wrappers allocate), one
# of each shared by every wrapper of the engine;
FLASHINFER_INT_WORKSPACE_BYTES = 8 * MIB
# the CUDA context of the process (kernels load lazily: torch's, cuBLAS's, flashinfer's);
CUDA_CONTEXT_BYTES = 512 * MIB
# cuBLAS and cuBLASLt workspaces torch allocates for the engine's stream (32 MiB each on
# Hopper).
CUBLAS_WORKSPACE_BYTES = 64 * MIB
# With CUDA graphs, on top of the largest graph's intermediates: torch's rounding of the
# pool into 2 and 20 MiB segments, and every graph's own index buffers.
GRAPH_SLACK_BYTES = 64 * MIB


def activation_bytes(cfg: ModelConfig, tokens: int, rows: int) -> int:
    """Live intermediates of one forward of `tokens` tokens with `rows` logits rows.

    Per token: the residual stream and its normed, attention and projection copies
    (~4 x hidden) and the MLP's gate and up outputs (2 x intermediate), counted at 4 bytes
    (for bf16 activations the factor 2 covers temporaries); layers run one after another,
    so one layer's worth is live at a time. Per logits row: the vocabulary in float32.
    """
    per_token = 4 * cfg.hidden_size + 2 * cfg.intermediate_size
    return (tokens * per_token + rows * cfg.vocab_size) * 4


def reserve_bytes(
    cfg: ModelConfig,
    device: str,
    max_batch_tokens: int,
    shapes: Sequence[GraphSize] = (),
    kv_bytes_per_page: int = 0,
    attention: str = "flashinfer",
) -> int:
    """Memory a model needs beyond weights and KV cache.

    An eager step of `max_batch_tokens` (each may yield logits). On CUDA also the CUDA
    context and cuBLAS's workspaces, and with the flashinfer `attention` its workspaces and
    the CUDA graphs of `shapes` (graphs need flashinfer): they run one at a time and share
    one pool, which holds the largest one's intermediates, and write into one set of output
    buffers (float32 logits of as many rows); plus the scratch page that padded rows write
    to (`kv_bytes_per_page`) and GRAPH_SLACK_BYTES. A CPU engine has none of these.
    """
    total = activation_bytes(cfg, max_batch_tokens, max_batch_tokens)
    if not device.startswith("cuda"):
        return total
    total += CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES
    if attention != "flashinfer":
        return total
    dims = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    total += float_workspace_bytes(dims, shapes) + FLASHINFER_INT_WORKSPACE_BYTES
    if shapes:
        tokens, rows = max(s.tokens for s in shapes), max(s.batch for s in shapes)
        total += activation_bytes(cfg, tokens, rows) + rows * cfg.vocab_size * 4
        total += kv_bytes_per_page + GRAPH_SLACK_BYTES
    return total


@dataclass(frozen=True)
class ModelMem:
    """What one model needs on its device, independent of the KV capacity."""

    name: str
    device: str
    weight_bytes: int
    kv_bytes_per_token: int
    reserve_bytes: int
    quantization: str = "none"
    unquantized_bytes: int = 0  # the weights in the serving dtype, unquantised


def model_mem(
    name: str,
    ckpt: Checkpoint,
    dtype: str,
    device: str,
    max_batch_tokens: int,
    shapes: Sequence[GraphSize] = (),
    page_size: int = 16,
    attention: str = "flashinfer",
    quantization: str = "none",
) -> ModelMem:
    """What `ckpt`, served in `dtype` (and `quantization`, for a float checkpoint) on
    `device`, needs; the rest as in `reserve_bytes`."""
    kv = ckpt.config.kv_bytes_per_token(dtype)
    reserve = reserve_bytes(ckpt.config, device, max_batch_tokens, shapes, kv * page_size,
                            attention)  # fmt: skip
    mode = ckpt.quantization if ckpt.quantization != "none" else quantization
    unquantized = ckpt.unquantized_bytes(dtype) if mode != "none" else 0
    return ModelMem(name, device, ckpt.weight_bytes(dtype, quantization), kv, reserve, mode,
                    unquantized)  # fmt: skip


@dataclass(frozen=True)
class ModelPlan:
    """One model's share of its device: weights, reserve and a KV cache of `pages`."""

    name: str
    device: str
    weight_bytes: int
    kv_bytes_per_token: int
    reserve_bytes: int
    kv_tokens: int
    pages: int
    kv_bytes: int
    quantization: str = "none"
    unquantized_bytes: int = 0


@dataclass(frozen=True)
class DevicePlan:
    """A device's budget and how much of it the plan uses."""

    device: str
    budget_bytes: int
    used_bytes: int


class PlanError(ValueError):
    """The models do not fit their budgets; the message holds the table and the fixes."""


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


# The leading columns of both the plan table and the refusal table.
_MODEL_HEADER = ["model", "device", "weights GiB", "KV B/token", "reserve GiB"]


def _model_cells(m: ModelMem | ModelPlan) -> list[str]:
    return [
        m.name,
        m.device,
        _gib(m.weight_bytes),
        str(m.kv_bytes_per_token),
        _gib(m.reserve_bytes),
    ]


def _align(rows: Sequence[Sequence[str]], names: int) -> str:
    """Left-align the first `names` columns, right-align the numbers after them."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            c.ljust(w) if i < names else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


@dataclass(frozen=True)
class MemoryPlan:
    """Per-model KV capacities and per-device usage, for the engines, logs and `trctl`."""

    page_size: int
    models: tuple[ModelPlan, ...]
    devices: tuple[DevicePlan, ...]

    def to_table(self) -> str:
        """Aligned text with sizes in GiB: one row per model, then one per device. With a
        quantised model, its mode and what its weights would take unquantised."""
        model_rows = [[*_MODEL_HEADER, "KV tokens", "pages", "KV GiB"]]
        model_rows += [
            [*_model_cells(m), str(m.kv_tokens), str(m.pages), _gib(m.kv_bytes)]
            for m in self.models
        ]
        if any(m.quantization != "none" for m in self.models):
            model_rows[0] += ["quantization", "unquantised GiB"]
            for row, m in zip(model_rows[1:], self.models, strict=True):
                row += [m.quantization, _gib(m.unquantized_bytes or m.weight_bytes)]
        device_rows = [["device", "budget GiB", "used GiB"]]
        device_rows += [[d.device, _gib(d.budget_bytes), _gib(d.used_bytes)] for d in self.devices]
        return f"{_align(model_rows, 2)}\n\n{_align(device_rows, 1)}"

    def to_dict(self) -> dict[str, object]:
        """JSON-able form with every size in bytes."""
        return {
            "page_size": self.page_size,
            "models": [asdict(m) for m in self.models],
            "devices": [asdict(d) for d in self.devices],
        }


def _refusal(failing: list[tuple[str, int, list[ModelMem], int]], min_kv: int) -> PlanError:
    """The error for devices whose budget cannot hold one request of `min_kv` tokens."""
    rows = [[*_MODEL_HEADER, "budget GiB", "needed GiB"]]
    totals = []
    for device, budget, group, kv_room in failing:
        needs = [m.weight_bytes + min_kv * m.kv_bytes_per_token + m.reserve_bytes for m in group]
        rows += [
            [*_model_cells(m), _gib(budget), _gib(n)] for m, n in zip(group, needs, strict=True)
        ]
        totals.append(
            f"{device}: needs at least {_gib(sum(needs))} GiB for {min_kv} KV tokens per model,"
            f" budget is {_gib(budget)} GiB (room for {max(kv_room, 0)} KV tokens)"
        )
    return PlanError(
        f"the models do not fit in memory:\n{_align(rows, 2)}\n"
        + "\n".join(totals)
        + "\nto fix: lower max_model_len, serve fewer or smaller models on the device,"
        " raise memory.budget_gib, or pick a smaller dtype"
    )


def plan_memory(
    models: list[ModelMem], budgets: dict[str, int], page_size: int, min_tokens: int
) -> MemoryPlan:
    """Give every model on a device the same KV capacity K, the most that fits the budget.

    `min_tokens` is one max-length request; fewer than that (rounded up to whole
    pages) on any device raises PlanError listing every device that falls short.
    """
    if page_size < 1 or min_tokens < 1:
        raise ValueError(f"page_size ({page_size}) and min_tokens ({min_tokens}) must be >= 1")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"model names must be unique, got {names}")
    groups: dict[str, list[ModelMem]] = {}
    for m in models:
        groups.setdefault(m.device, []).append(m)
    missing = sorted(set(groups) - set(budgets))
    if missing:
        raise ValueError(f"no memory budget for device(s) {missing}")

    min_kv = -(-min_tokens // page_size) * page_size
    capacity: dict[str, int] = {}
    device_plans = []
    failing = []
    for device, group in groups.items():
        budget = budgets[device]
        fixed = sum(m.weight_bytes + m.reserve_bytes for m in group)
        per_token = sum(m.kv_bytes_per_token for m in group)
        kv_tokens = (budget - fixed) // per_token // page_size * page_size
        if kv_tokens < min_kv:
            failing.append((device, budget, group, kv_tokens))
            continue
        capacity[device] = kv_tokens
        device_plans.append(DevicePlan(device, budget, fixed + kv_tokens * per_token))
    if failing:
        raise _refusal(failing, min_kv)

    model_plans = tuple(
        ModelPlan(
            name=m.name,
            device=m.device,
            weight_bytes=m.weight_bytes,
            kv_bytes_per_token=m.kv_bytes_per_token,
            reserve_bytes=m.reserve_bytes,
            kv_tokens=capacity[m.device],
            pages=capacity[m.device] // page_size,
            kv_bytes=capacity[m.device] * m.kv_bytes_per_token,
            quantization=m.quantization,
            unquantized_bytes=m.unquantized_bytes,
        )
        for m in models
    )
    return MemoryPlan(page_size, model_plans, tuple(device_plans))


def device_budget(device: str, budget_gib: float | None, fraction: float) -> int:
    """Bytes the plan may use on `device`: the configured GiB, else a fraction of free memory.

    Free memory is NVML's free bytes for "cuda[:N]" and MemAvailable for "cpu".
    """
    if budget_gib is not None:
        return int(budget_gib * GIB)
    if not 0 < fraction <= 1:
        raise ValueError(f"memory fraction must be in (0, 1], got {fraction}")
    if device == "cpu":
        return int(devices.available_ram_bytes() * fraction)
    kind, _, index = device.partition(":")
    if kind != "cuda" or not (index or "0").isdigit():
        raise ValueError(f"unknown device {device!r}; expected 'cpu' or 'cuda:N'")
    gpu = next((g for g in devices.probe_gpus() if g.index == int(index or "0")), None)
    if gpu is None:
        raise ValueError(f"device {device!r}: NVML reports no such GPU")
    return int(gpu.free_bytes * fraction)
