"""From a validated config to what the supervisor starts: device, MPS, memory plan, specs.

    probe devices (NVML; none = CPU) -> decide MPS -> joint memory plan -> one EngineSpec
    per model, its KV capacity = its planned pages x page size

Nothing here starts a process, so `tokenrouterd --check` runs it to print the plan.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace

from trd import devices
from trd.config import CPU_MAX_KV_TOKENS, Config, ConfigError
from trd.engines.spec import EngineSpec
from trd.memplan.plan import MemoryPlan, ModelMem, device_budget, model_mem, plan_memory
from trd.mps.resolve import resolve_mps

MPS_BINARY = "nvidia-cuda-mps-control"


@dataclass(frozen=True)
class Launch:
    device: str  # "cpu" or "cuda:N"
    use_mps: bool
    plan: MemoryPlan
    specs: tuple[EngineSpec, ...]

    def with_env(self, env: dict[str, dict[str, str]]) -> tuple[EngineSpec, ...]:
        """The specs with extra environment per model name (e.g. the MPS pipe directory)."""
        return tuple(replace(s, env={**s.env, **env.get(s.name, {})}) for s in self.specs)


def resolve_device(setting: str, gpus: list[devices.GpuInfo]) -> str:
    if setting == "cpu" or (setting == "auto" and not gpus):
        return "cpu"
    index = 0 if setting in ("auto", "cuda") else int(setting.partition(":")[2])
    if not any(g.index == index for g in gpus):
        found = [g.index for g in gpus]
        raise ConfigError(f"device: {setting!r}: NVML reports no such GPU (found: {found})")
    return f"cuda:{index}"


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


def plan_launch(cfg: Config) -> Launch:
    """Decide device and MPS and plan memory; PlanError when the models do not fit."""
    gpus = devices.probe_gpus() if cfg.device != "cpu" else []
    device = resolve_device(cfg.device, gpus)
    # A CPU deployment has no GPU for MPS, even on a host that has one.
    use_mps = resolve_mps(cfg.mps, gpus if device != "cpu" else [], shutil.which(MPS_BINARY))
    # One CUDA graph per decode batch size at most; a CPU engine captures none.
    graphs = 0 if device == "cpu" else cfg.engine.max_batch_size
    mems = [
        model_mem(m.name, m.path, m.dtype, device, cfg.engine.max_batch_tokens, graphs)
        for m in cfg.models
    ]
    plan = plan_memory(
        mems, {device: _budget(cfg, device, mems)}, cfg.engine.page_size, cfg.max_model_len
    )
    specs = tuple(
        EngineSpec(
            model=i,
            name=m.name,
            path=str(m.path),
            num_models=len(cfg.models),
            policy=cfg.policy,
            policy_params=dict(cfg.policy_params),
            dtype=m.dtype,
            device=device,
            kv_tokens=mp.pages * cfg.engine.page_size,
            page_size=cfg.engine.page_size,
            max_batch_tokens=cfg.engine.max_batch_tokens,
            max_batch_size=cfg.engine.max_batch_size,
            max_model_len=cfg.max_model_len,
            threads=cfg.threads(),
            thresholds=cfg.thresholds.get(m.name, (1,)),
            max_wait_ms=cfg.max_wait_ms,
            spin_ms=cfg.engine.spin_ms,
            cpu_linear=cfg.engine.cpu_linear,
            pending_kv=cfg.engine.pending_kv,
            step_sync=cfg.engine.step_sync,
        )
        for i, (m, mp) in enumerate(zip(cfg.models, plan.models, strict=True))
    )
    return Launch(device, use_mps, plan, specs)
