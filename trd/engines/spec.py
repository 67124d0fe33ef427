"""What an engine process is started with: one frozen, validated, picklable object.

    EngineSettings   the config's `engine:` section; each key defined once, here, with its
                     default, its check and its doc (the config reader reads these fields)
    BatchingSettings the scalars of `batching:` (the thresholds are per model, in the spec)
    EngineSpec       one engine: its model (read once by the supervisor), dtype, device,
                     KV pages from the memory plan, batching thresholds, the settings

The daemon builds specs from the config (`trd/supervisor/deployment.py`); tests and
benchmarks build them with `EngineSpec.of(path, ...)`. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from trd.models.checkpoint import DTYPES, Checkpoint, read_checkpoint
from trd.policies.params import PolicySpec

CPU_LINEARS = ("torch", "onednn")  # how an engine runs its linear layers on CPU
ATTENTION_BACKENDS = ("auto", "torch", "flashinfer")
# flashinfer's kernels exist for these only (its dtype maps have no float32/float64 entry).
FLASHINFER_DTYPES = ("bfloat16", "float16")


def setting(default: Any, doc: str, **check: Any) -> Any:
    """A settings field: its default, a one-line doc and its check (low, choices, auto)."""
    return field(default=default, metadata={"doc": doc, **check})


class SettingError(ValueError):
    """A setting out of range; the message is `section.key: value: reason`."""


def check_settings(obj: Any, section: str) -> None:
    """Check every field of a settings dataclass against its metadata."""
    for f in fields(obj):
        value, meta, key = getattr(obj, f.name), f.metadata, f"{section}.{f.name}"
        if value is None and meta.get("auto"):
            continue
        if isinstance(f.default, bool):
            if not isinstance(value, bool):
                raise SettingError(f"{key}: {value!r}: expected true or false (on or off)")
        elif isinstance(f.default, tuple):
            _check_sizes(key, value)
        elif "choices" in meta:
            if value not in meta["choices"]:
                raise SettingError(f"{key}: {value!r}: expected one of {list(meta['choices'])}")
        elif isinstance(f.default, int | float) or meta.get("auto"):
            kind = int if isinstance(f.default, int) or meta.get("auto") else (int, float)
            if isinstance(value, bool) or not isinstance(value, kind):
                want = "an integer" if kind is int else "a number"
                raise SettingError(f"{key}: {value!r}: expected {want}")
            if value < meta.get("low", float("-inf")):
                raise SettingError(f"{key}: {value!r}: must be >= {meta['low']}")


def _check_sizes(key: str, value: Any) -> None:
    ok = (
        isinstance(value, tuple)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)
    )
    if not ok or list(value) != sorted(set(value)):
        raise SettingError(f"{key}: {list(value) if isinstance(value, tuple) else value!r}: "
                           "expected a non-empty list of increasing integers >= 1")  # fmt: skip


def check_cuda_dtype(where: str, dtype: str, attention: str) -> None:
    """On CUDA the flashinfer backend ("auto" picks it) runs float16 and bfloat16 only."""
    if attention != "torch" and dtype not in FLASHINFER_DTYPES:
        raise ValueError(
            f"{where}: {dtype!r}: flashinfer, the CUDA attention backend, runs only "
            f"{' and '.join(FLASHINFER_DTYPES)}; choose one of them, or engine.attention: "
            "torch for the (slower) torch attention on CUDA"
        )


@dataclass(frozen=True, slots=True)
class EngineSettings:
    page_size: int = setting(16, "tokens per KV page", low=1)
    max_batch_tokens: int = setting(1024, "tokens one forward feeds at most", low=1)
    max_batch_size: int = setting(64, "requests one forward holds at most", low=1)
    threads: int | None = setting(None, "torch threads per engine (auto: cores / engines)",
                                  low=1, auto=True)  # fmt: skip
    threads_alone: int | None = setting(
        None, "torch threads for a forward while the host's other engines are idle "
        "(auto: the host's cores on CPU when threads is auto, else threads)", low=1, auto=True,
    )  # fmt: skip
    spin_ms: float = setting(20.0, "poll this long (not sleep) while a request is at a peer",
                             low=0)  # fmt: skip
    cpu_linear: str = setting("torch", "CPU linears: torch, or onednn (packed, float32 only)",
                              choices=CPU_LINEARS)  # fmt: skip
    attention: str = setting("auto", "attention backend: flashinfer on CUDA, torch on CPU",
                             choices=ATTENTION_BACKENDS)  # fmt: skip
    quant_dense_from: int | None = setting(
        0, "quantised models on CPU: the rows from which a linear runs dense, not the "
        "int8 kernel (0, the default: never, so a request's tokens do not depend on what "
        "it is batched with; auto: measured at engine start)", low=0, auto=True,
    )  # fmt: skip
    prefix_cache: bool = setting(True, "keep full KV pages after a request and reuse them "
                                 "for any request with the same prefix")  # fmt: skip
    prefill_ahead: bool = setting(
        False, "a model other than the entry prefills each new prompt as it arrives, so a "
        "handoff to it finds the prompt in its prefix cache (costs its compute for requests "
        "it never serves; needs prefix_cache)",
    )  # fmt: skip
    draft_tokens: int = setting(
        4, "a model with a draft (models[].draft): proposals per request and step", low=1
    )
    draft_rows: int = setting(
        8, "a model with a draft: tokens per request and step at most draft_rows / requests "
        "(no proposals from draft_rows / 2 requests on: verifying them costs more than it "
        "saves)", low=2,
    )  # fmt: skip
    grammar_cache: int = setting(
        256, "compiled grammars an engine keeps for the next request with the same one "
        "(least recently used dropped; 30-200 KB each)", low=1,
    )  # fmt: skip
    pending_kv: bool = setting(True, "ablation: false frees a request's KV when it leaves")
    step_sync: bool = setting(False, "ablation: true puts a global barrier between steps")
    cuda_graphs: bool = setting(True, "on CUDA: replay captured graphs for steps that fit a bucket")
    graph_batch_sizes: tuple[int, ...] = setting(
        (1, 2, 4, 8, 16, 24, 32, 48, 64), "batch sizes with a captured graph (decode and extend)"
    )
    graph_extend_lens: tuple[int, ...] = setting(
        (2, 4, 8), "new tokens per request (at most) of the captured extend graphs"
    )

    def __post_init__(self) -> None:
        for f in fields(self):  # YAML gives lists; the settings are frozen (hashable) tuples
            if isinstance(f.default, tuple) and isinstance(getattr(self, f.name), list):
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))
        check_settings(self, "engine")
        if self.prefill_ahead and not self.prefix_cache:
            raise SettingError("engine.prefill_ahead: true: needs prefix_cache (the prefilled "
                               "prompt is kept only as prefix-cache entries)")  # fmt: skip

    def graph_batches(self) -> tuple[int, ...]:
        """The batch buckets that can occur: those above max_batch_size are never captured."""
        return tuple(b for b in self.graph_batch_sizes if b <= self.max_batch_size)


@dataclass(frozen=True, slots=True)
class BatchingSettings:
    max_wait_ms: float = setting(20.0, "a runnable request never waits longer for a batch",
                                 low=0)  # fmt: skip
    auto_interval_s: float = setting(0.0, "> 0: re-optimise the thresholds this often", low=0)

    def __post_init__(self) -> None:
        check_settings(self, "batching")


@dataclass(frozen=True, slots=True)
class DraftModel:
    """The model whose proposals an engine verifies: loaded in that engine's process."""

    checkpoint: Checkpoint
    dtype: str = "float32"
    quantization: str = "none"


@dataclass(frozen=True, slots=True)
class EngineSpec:
    index: int  # 0 = the entry model, which receives Submits
    name: str
    checkpoint: Checkpoint
    kv_pages: int
    dtype: str = "float32"
    device: str = "cpu"
    quantization: str = "none"  # a float checkpoint's weights quantised at load
    num_models: int = 1
    max_model_len: int = 0  # 0: the model's context
    policy: PolicySpec = PolicySpec("scripted")  # noqa: RUF009 - frozen, shared safely
    settings: EngineSettings = EngineSettings()
    threads: int = 1
    threads_alone: int = 0  # 0: threads (never wider)
    host_peers: tuple[int, ...] = ()  # the other engines on this host (they share its cores)
    thresholds: tuple[int, ...] = (1,)  # delayed batching: B indexed by active requests
    batching: BatchingSettings = BatchingSettings()
    env: dict[str, str] = field(default_factory=dict)  # e.g. the CUDA MPS pipe directory
    draft: DraftModel | None = None  # speculative decoding (trd/engines/speculate.py)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not supported (choose from {DTYPES})")
        if (
            self.kv_pages < 1
            or self.max_model_len < 0
            or self.threads < 1
            or self.threads_alone < 0
        ):
            raise ValueError(
                f"engine {self.name!r}: kv_pages, threads >= 1; threads_alone, max_model_len >= 0"
            )
        if self.device.startswith("cuda"):
            check_cuda_dtype(f"engine {self.name!r}: dtype", self.dtype, self.settings.attention)
        if self.settings.cpu_linear == "onednn" and (
            self.device != "cpu" or self.dtype != "float32"
        ):
            raise ValueError(
                "engine.cpu_linear: 'onednn': needs device cpu and dtype float32, "
                f"got {self.device}, {self.dtype}"
            )

    @property
    def context(self) -> int:
        """The longest sequence this engine serves."""
        limit = self.checkpoint.config.context
        return min(self.max_model_len, limit) if self.max_model_len else limit

    @classmethod
    def of(
        cls,
        path: Path | str,
        *,
        kv_tokens: int = 32768,
        policy: PolicySpec | None = None,
        index: int = 0,
        num_models: int = 1,
        **rest: Any,
    ) -> EngineSpec:
        """A spec for the checkpoint at `path`; engine settings may be given by name."""
        names = {f.name for f in fields(EngineSettings)}
        settings = EngineSettings(**{k: rest.pop(k) for k in list(rest) if k in names})
        ckpt = read_checkpoint(path)
        pages = -(-kv_tokens // settings.page_size)
        return cls(index, Path(path).name, ckpt, pages, num_models=num_models,
                   policy=policy or PolicySpec("scripted"), settings=settings, **rest)  # fmt: skip
