"""Load a checkpoint directory into `CausalLM` at a serving dtype, quantised or not.

A quantised checkpoint (`trd/models/quantization.py`) is served as stored; a float one is
served in `dtype`, or quantised at load with `quantization` int8 / int4.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable

import torch
from safetensors import SafetensorError, safe_open

from trd.models.checkpoint import DTYPES, Checkpoint, CheckpointError
from trd.models.model import CausalLM
from trd.models.qformat import SUFFIXES, QuantTensor
from trd.models.quantize import install, quantise_loaded
from trd.models.rotary import RotaryEmbedding

# Buffers some exporters write that carry no weights.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not supported (choose from {DTYPES})")
    return getattr(torch, name)


def _ignored(key: str, tied: bool) -> bool:
    return key.endswith(_IGNORED_SUFFIXES) or (tied and key == "lm_head.weight")


def _read(ckpt: Checkpoint, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Every tensor: float ones cast to dtype on `device`, quantised ones as stored on the
    host (their layers are built there)."""
    weights: dict[str, torch.Tensor] = {}
    for path in ckpt.weight_files:
        try:
            with safe_open(path, framework="pt") as f:
                # One tensor at a time, cast on the host, then moved: the peak is the
                # served model plus one tensor, not the checkpoint's dtype on the device.
                for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                    if _ignored(key, ckpt.config.tie_word_embeddings):
                        continue
                    t = f.get_tensor(key)
                    stored = key.rsplit(".", 1)[-1] in SUFFIXES
                    weights[key] = t if stored else t.to(dtype).to(device)
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path}: cannot read safetensors ({exc})") from None
    return weights


def read_weights(
    ckpt: Checkpoint, dtype: torch.dtype, device: torch.device
) -> tuple[dict[str, torch.Tensor], dict[str, QuantTensor]]:
    """The float tensors (cast to dtype, on device) and the quantised weights by layer."""
    weights = _read(ckpt, dtype, device)
    return weights, _quantised(ckpt, weights)


def _quantised(ckpt: Checkpoint, weights: dict[str, torch.Tensor]) -> dict[str, QuantTensor]:
    """Take the quantised weights out of `weights`, keyed by layer name."""
    names = sorted({k.rsplit(".", 1)[0] for k in weights if k.endswith(".qweight")})
    out = {}
    for name in names:
        try:
            out[name] = QuantTensor.from_tensors(name, weights)
        except (KeyError, ValueError) as exc:
            raise CheckpointError(f"{ckpt.path}: {exc}") from None
        for suffix in SUFFIXES:
            weights.pop(f"{name}.{suffix}", None)
    return out


def load_model(
    ckpt: Checkpoint, dtype: str, device: torch.device, quantization: str = "none"
) -> CausalLM:
    """Build the model on `device`: the checkpoint's weights, float ones cast to dtype."""
    cfg, model_dir = ckpt.config, ckpt.path
    with torch.device("meta"):
        model = CausalLM(cfg)
    expected = model.state_dict()
    tdtype = torch_dtype(dtype)
    weights, quantised = read_weights(ckpt, tdtype, device)
    shapes = {k: tuple(t.shape) for k, t in weights.items()}
    shapes |= {f"{name}.weight": qt.shape for name, qt in quantised.items()}
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{model_dir}: weights do not match a {cfg.model_type} model with this config.json"
            f" (missing: {missing[:5]}{'...' if len(missing) > 5 else ''};"
            f" unexpected: {unexpected[:5]}{'...' if len(unexpected) > 5 else ''})"
        )
    for key, shape in shapes.items():
        if shape != tuple(expected[key].shape):
            raise CheckpointError(
                f"{model_dir}: tensor {key} has shape {shape}, config.json implies "
                f"{tuple(expected[key].shape)}"
            )
    if quantised:
        biases = {n: weights.pop(f"{n}.bias") for n in quantised if f"{n}.bias" in weights}
        install(model, quantised, biases, device, tdtype)
    model.load_state_dict(weights, assign=True, strict=not quantised)
    if quantization != "none" and not quantised:
        quantise_loaded(model, quantization, cfg.tie_word_embeddings)
    map_in([*model.parameters(), *model.buffers()])  # what the model holds, quantised or not
    # The rope frequencies are derived, not loaded: build them for real on the device.
    model.rope = RotaryEmbedding(cfg.rope, cfg.head_dim, device)
    return model.eval()


def map_in(tensors: Iterable[torch.Tensor]) -> None:
    """Read a byte of every page of the CPU tensors, so that they are resident from now on.

    A weight kept in the checkpoint's dtype is a view of the file, which safetensors
    maps: the kernel reads its pages in when they are first touched. A forward reads
    every matrix whole, but an embedding only in the rows of the tokens it looks up, so
    without this an engine's resident size grows for hours as token ids it has not seen
    arrive, up to the whole table (272 MB in Qwen2.5-0.5B, whose LM head is another
    matrix): a curve an operator cannot tell from a leak (issue 54). The pages stay the
    file's: shared by every engine of that checkpoint, reclaimable under pressure."""
    for t in tensors:
        if t.device.type == "cpu" and t.is_contiguous() and t.numel():
            flat = t.detach().reshape(-1).view(torch.uint8)
            flat[:: mmap.PAGESIZE].sum()  # a byte of each page, from the tensor's start
            flat[-1:].sum()  # and of its last page
