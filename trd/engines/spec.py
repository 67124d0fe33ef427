"""What an engine process needs to start: a frozen, picklable description."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CPU_LINEARS = ("torch", "onednn")  # how an engine runs its linear layers on CPU


@dataclass(frozen=True, slots=True)
class EngineSpec:
    model: int  # index; 0 = the entry model that receives Submits
    name: str
    path: str
    num_models: int
    policy: str
    policy_params: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    device: str = "cpu"
    kv_tokens: int = 32768
    page_size: int = 16
    max_batch_tokens: int = 1024
    max_batch_size: int = 64
    max_model_len: int | None = None
    attention: str = "auto"
    cpu_linear: str = "torch"  # "onednn": oneDNN-packed float32 linears on CPU
    threads: int = 1
    thresholds: tuple[int, ...] = (1,)  # delayed batching: B indexed by active requests
    max_wait_ms: float = 20.0
    spin_ms: float = 20.0  # poll (not sleep) this long while a request is at a peer
    # Ablations, to measure what each mechanism buys (both off in normal serving):
    pending_kv: bool = True  # False: free a request's KV when it leaves for a peer
    step_sync: bool = False  # True: a global barrier between the engines' steps
    env: dict[str, str] = field(default_factory=dict)  # e.g. CUDA MPS pipe directory
