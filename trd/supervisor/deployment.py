"""A deployment: what a validated config becomes on this host before anything starts.

    probe devices (NVML; none = CPU) -> decide MPS -> joint memory plan -> one EngineSpec
    per model, its KV pages from the plan

A GPU is handed to the engines (and to the MPS server) by UUID in CUDA_VISIBLE_DEVICES,
so each engine sees it alone as `cuda:0`: NVML numbers GPUs in PCI bus order, CUDA
fastest first, and an MPS server renumbers the devices it was given.

Nothing here starts a process, so `tokenrouterd --check` runs it to print the plan.
The plan covers the models this host runs; a remote model gets a RemoteSpec, and its
host plans its own memory with this same code (`tokenrouterd engine`).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace

from trd import devices
from trd.config import CPU_MAX_KV_TOKENS, Config, ConfigError, ModelEntry, draft_of
from trd.engines.buckets import GraphShape, graph_shapes
from trd.engines.spec import DraftModel, EngineSettings, EngineSpec
from trd.memplan.plan import MemoryPlan, ModelMem, device_budget, model_mem, plan_memory
from trd.models.attention.support import choose_backend
from trd.mps.manager import MPS_CONTROL
from trd.mps.resolve import resolve_mps
from trd.remote.spec import RemoteSpec

Spec = EngineSpec | RemoteSpec


@dataclass(frozen=True)
class Deployment:
    device: str  # "cpu" or "cuda:N" (N: NVML's index)
    gpu_uuid: str  # the GPU's UUID, "" on CPU
    use_mps: bool
    mps_reason: str  # why MPS is off, for `trctl status`
    plan: MemoryPlan  # this host's engines only
    specs: tuple[Spec, ...]  # in model order: index i at position i
    attention: dict[str, tuple[str, str]]  # local model -> (backend, why)

    def with_env(self, env: dict[str, dict[str, str]]) -> tuple[Spec, ...]:
        """The specs with extra environment per model name (e.g. the MPS pipe directory)."""
        return tuple(
            replace(s, env={**s.env, **env.get(s.name, {})}) if isinstance(s, EngineSpec) else s
            for s in self.specs
        )


def resolve_device(setting: str, gpus: list[devices.GpuInfo]) -> str:
    if setting == "cpu" or (setting == "auto" and not gpus):
        return "cpu"
    index = 0 if setting in ("auto", "cuda") else int(setting.partition(":")[2])
    if not any(g.index == index for g in gpus):
        found = [g.index for g in gpus]
        raise ConfigError(f"device: {setting!r}: NVML reports no such GPU (found: {found})")
    return f"cuda:{index}"


def engine_graphs(settings: EngineSettings, device: str, attention: str) -> list[GraphShape]:
    """The CUDA graphs an engine with `attention` captures (flashinfer only); [] for none."""
    if device == "cpu" or not settings.cuda_graphs or attention != "flashinfer":
        return []
    return graph_shapes(settings.graph_batches(), settings.graph_extend_lens)


def engine_env(gpu: devices.GpuInfo | None) -> dict[str, str]:
    """What an engine process needs to see `gpu` alone, as cuda:0."""
    if gpu is None:
        return {}
    return {"CUDA_VISIBLE_DEVICES": gpu.uuid or str(gpu.index), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _budget(cfg: Config, device: str, mems: list[ModelMem]) -> int:
    """The device budget, lowered so the KV cache holds at most max_kv_tokens per model."""
    budget = device_budget(device, cfg.memory.budget_gib, cfg.memory.fraction)
    cap = cfg.memory.max_kv_tokens
    if cap is None and device == "cpu":
        cap = max(CPU_MAX_KV_TOKENS, cfg.max_model_len)
    if cap is None:
        return budget
    fixed = sum(m.weight_bytes + m.reserve_bytes for m in mems)
    return min(budget, fixed + cap * sum(m.kv_bytes_per_token for m in mems))


def plan_deployment(cfg: Config) -> Deployment:
    """Decide device and MPS and plan memory; PlanError when the models do not fit."""
    gpus = devices.probe_gpus() if cfg.device != "cpu" else []
    device = resolve_device(cfg.device, gpus)
    # A CPU deployment has no GPU for MPS, even on a host that has one.
    use_mps, mps_reason = resolve_mps(
        cfg.mps, gpus if device != "cpu" else [], shutil.which(MPS_CONTROL)
    )
    attention = {m.name: _attention(cfg, device, m) for m in cfg.models if m.checkpoint is not None}
    mems = [
        _with_draft(
            cfg,
            m,
            model_mem(
                m.name,
                m.checkpoint,
                m.dtype,
                device,
                cfg.engine.max_batch_tokens,
                engine_graphs(cfg.engine, device, attention[m.name][0]),
                cfg.engine.page_size,
                attention[m.name][0],
                m.quantization,
            ),
        )
        for m in cfg.models
        if m.checkpoint is not None
    ]
    plan = plan_memory(
        mems, {device: _budget(cfg, device, mems)}, cfg.engine.page_size, cfg.max_model_len
    )
    gpu = next((g for g in gpus if f"cuda:{g.index}" == device), None)
    pages = {mp.name: mp.pages for mp in plan.models}
    local = tuple(i for i, m in enumerate(cfg.models) if m.checkpoint is not None)
    specs = tuple(
        _spec(cfg, i, m, gpu, pages[m.name], local)
        if m.checkpoint is not None
        else _remote(cfg, i, m)
        for i, m in enumerate(cfg.models)
        if m.checkpoint is not None or m.remote is not None
    )
    uuid = gpu.uuid if gpu else ""
    return Deployment(device, uuid, use_mps, mps_reason, plan, specs, attention)


def _with_draft(cfg: Config, m: ModelEntry, mem: ModelMem) -> ModelMem:
    """A model with a draft holds the draft's weights too, and the draft's KV over the same
    pages (trd/engines/speculate.py)."""
    draft = draft_of(cfg, m)
    if draft is None or draft.checkpoint is None:
        return mem
    ckpt = draft.checkpoint
    return replace(
        mem,
        weight_bytes=mem.weight_bytes + ckpt.weight_bytes(draft.dtype, draft.quantization),
        kv_bytes_per_token=mem.kv_bytes_per_token + ckpt.config.kv_bytes_per_token(draft.dtype),
    )


def _attention(cfg: Config, device: str, m: ModelEntry) -> tuple[str, str]:
    """The attention backend the model's engine will run, and why (support.py)."""
    assert m.checkpoint is not None
    try:
        return choose_backend(cfg.engine.attention, device, m.checkpoint.config, m.dtype)
    except ValueError as exc:
        raise ConfigError(f"model {m.name!r}: {exc}") from None


def _spec(
    cfg: Config,
    i: int,
    m: ModelEntry,
    gpu: devices.GpuInfo | None,
    pages: int,
    local: tuple[int, ...],
) -> EngineSpec:
    assert m.checkpoint is not None
    return EngineSpec(
        index=i,
        name=m.name,
        checkpoint=m.checkpoint,
        kv_pages=pages,
        dtype=m.dtype,
        device="cpu" if gpu is None else "cuda:0",
        quantization=m.quantization,
        num_models=len(cfg.models),
        max_model_len=cfg.max_model_len,
        policy=cfg.policy,
        settings=m.settings(cfg.engine),
        threads=cfg.threads(),
        # On a GPU the forward is not the CPU threads' work: never wider there.
        threads_alone=cfg.threads_alone() if gpu is None else 0,
        host_peers=tuple(j for j in local if j != i),
        thresholds=cfg.thresholds.get(m.name, (1,)),
        batching=cfg.batching,
        env=engine_env(gpu),
        draft=_draft(cfg, m),
    )


def _draft(cfg: Config, m: ModelEntry) -> DraftModel | None:
    draft = draft_of(cfg, m)
    if draft is None or draft.checkpoint is None:
        return None
    return DraftModel(draft.checkpoint, draft.dtype, draft.quantization)


def _remote(cfg: Config, i: int, m: ModelEntry) -> RemoteSpec:
    assert m.remote is not None
    return RemoteSpec(
        index=i,
        name=m.name,
        address=m.remote,
        token=cfg.remote_token,
        model_names=tuple(e.name for e in cfg.models),
        max_model_len=cfg.max_model_len,
        entry_dir=cfg.models[0].path,
        dtype=m.dtype,
        policy=cfg.policy,
        settings=m.settings(cfg.engine),
        thresholds=cfg.thresholds.get(m.name, (1,)),
        batching=cfg.batching,
    )


def quantization_lines(cfg: Config, deployment: Deployment) -> list[str]:
    """`--check`: each quantised model's weights before and after, and on CPU the row
    counts from which its linears would run dense here (measured now, as an engine does
    at start; imports torch)."""
    lines = []
    for m, mp in ((m, mp) for m in cfg.local for mp in deployment.plan.models if mp.name == m.name):
        if mp.quantization == "none":
            continue
        gib = 1 << 30
        lines.append(f"model {m.name!r} quantization {mp.quantization}: weights "
                     f"{mp.weight_bytes / gib:.2f} GiB (unquantised {m.dtype}: "
                     f"{mp.unquantized_bytes / gib:.2f} GiB)")  # fmt: skip
        if deployment.device == "cpu":
            from trd.models.dispatch import crossovers, describe
            from trd.models.loader import torch_dtype
            from trd.models.quantization import linear_kinds

            assert m.checkpoint is not None
            fixed = cfg.engine.quant_dense_from
            if fixed is not None:  # set: nothing to measure
                dense = f"{fixed or 'never'} (engine.quant_dense_from)"
            else:
                kinds = linear_kinds(m.checkpoint.matrices, mp.quantization)
                found = describe(crossovers(kinds, cfg.engine.max_batch_tokens,
                                            torch_dtype(m.dtype)))  # fmt: skip
                dense = ", ".join(f"{k}: {'never' if c is None else c}" for k, c in found.items())
            lines.append(f"model {m.name!r} linears run dense from rows: {dense}")
    return lines
