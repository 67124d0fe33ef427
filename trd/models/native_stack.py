"""A decode step of a quantised float32 model on the CPU in one native call (cpu_stack.cpp).

At one row a 28-layer model's step through the modules is ~30 Python-level calls a layer
(norms, projections, rotation, the KV write, attention, SiLU, residual adds), each a few
microseconds of dispatch: 8-13 ms of a 30-70 ms step on the demo pair. When every feed of
a step is output tokens (a decode, a handoff's suffix, each token attending to its causal
prefix in the native attention: trd/models/attention/torch_paged.py), the runner hands
the decoder stack to this call instead; it makes the same native calls on the same
numbers in the same order, so each token's hidden state is bit for bit what the modules
compute, whichever path its step took (tests/test_native_stack.py). Steps with a prompt's
tokens keep the modules.

`NativeStack.of` returns None where a model cannot take it: not float32 on the CPU, a
layer that is not a quantised linear on the kernel, q/k norms (Qwen3), or linears that
switch to the dense path by row count (`engine.quant_dense_from`).
"""

from __future__ import annotations

import ctypes
from ctypes import c_float, c_int32, c_void_p

import numpy as np
import torch
from torch import nn

from trd.models import qkernel
from trd.models.model import CausalLM, DecoderLayer
from trd.models.qlinear import QuantLinear


class _Linear(ctypes.Structure):
    _fields_ = [("qweight", c_void_p), ("scales", c_void_p), ("mins", c_void_p),
                ("bias", c_void_p), ("bits", c_int32), ("out_features", c_int32)]  # fmt: skip


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", c_void_p), ("post_norm", c_void_p), ("qkv", _Linear * 3),
                ("qkv_parts", c_int32), ("o", _Linear), ("gate_up", _Linear * 2),
                ("gate_up_parts", c_int32), ("down", _Linear), ("k_cache", c_void_p),
                ("v_cache", c_void_p)]  # fmt: skip


class _Shape(ctypes.Structure):
    _fields_ = [("hidden", c_int32), ("heads", c_int32), ("kv_heads", c_int32),
                ("head_dim", c_int32), ("intermediate", c_int32), ("eps", c_float)]  # fmt: skip


def _ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _linear(m: nn.Module | None) -> _Linear | None:
    if not isinstance(m, QuantLinear) or m.kernel is None or m.crossover is not None:
        return None
    return _Linear(_ptr(m.qweight), _ptr(m.scales), _ptr(m.mins), _ptr(m.bias), m.bits,
                   m.out_features)  # fmt: skip


def _parts(module: nn.Module, fused: str, *separate: str) -> list[_Linear] | None:
    """The fused weight `fused` of `module`, else its `separate` ones (fusing drops them)."""
    names = [fused] if getattr(module, fused) is not None else separate
    found = [_linear(getattr(module, name, None)) for name in names]
    return None if any(p is None for p in found) else [p for p in found if p is not None]


def _layer(layer: DecoderLayer, kv_cache: torch.Tensor) -> _Layer | None:
    attn, mlp = layer.self_attn, layer.mlp
    qkv = _parts(attn, "qkv_proj", "q_proj", "k_proj", "v_proj")
    gate_up = _parts(mlp, "gate_up_proj", "gate_proj", "up_proj")
    o, down = _linear(attn.o_proj), _linear(mlp.down_proj)
    norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
    if qkv is None or gate_up is None or o is None or down is None or attn.qk_norm:
        return None
    if any(w.dtype != torch.float32 or not w.is_contiguous() for w in norms):
        return None
    qkv_parts, gate_up_parts = (_Linear * 3)(*qkv), (_Linear * 2)(*gate_up)
    return _Layer(_ptr(norms[0]), _ptr(norms[1]), qkv_parts, len(qkv), o, gate_up_parts,
                  len(gate_up), down, _ptr(kv_cache[0]), _ptr(kv_cache[1]))  # fmt: skip


class NativeStack:
    """`stack(ids, positions, seq_lens, write_slots, rows, offsets, slots)`: the final-norm
    hidden states (T, hidden) of T tokens of output feeds, as `CausalLM.forward` computes
    them.
    Holds raw pointers into the model's buffers and the KV caches: lives as long as they do."""

    def __init__(self, model: CausalLM, layers: list[_Layer], kernel: qkernel.Kernel) -> None:
        cfg = model.cfg
        self.model = model
        self._layers = (_Layer * len(layers))(*layers)
        self._shape = _Shape(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                             cfg.intermediate_size, cfg.rms_norm_eps)  # fmt: skip
        self._fn = kernel.lib.trd_decode_stack
        self._fn.argtypes = [c_void_p, ctypes.c_int, c_void_p, c_void_p, ctypes.c_int,
                             *[c_void_p] * 6, ctypes.c_int]  # fmt: skip
        self._fn.restype = ctypes.c_int

    @classmethod
    def of(cls, model: CausalLM, kv_caches: list[torch.Tensor]) -> NativeStack | None:
        kernel = qkernel.load()
        cache = kv_caches[0] if kv_caches else None
        if kernel is None or cache is None or cache.dtype != torch.float32:
            return None
        if cache.device.type != "cpu" or not all(c.is_contiguous() for c in kv_caches):
            return None
        layers = []
        for layer, kv in zip(model.model.layers, kv_caches, strict=True):
            built = _layer(layer, kv) if isinstance(layer, DecoderLayer) else None
            if built is None:
                return None
            layers.append(built)
        return cls(model, layers, kernel)

    def __call__(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        seq_lens: np.ndarray,
        write_slots: torch.Tensor,
        rows: torch.Tensor,
        offsets: torch.Tensor,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        model = self.model
        x = model.model.embed_tokens(ids).to(torch.float32).contiguous()
        cos, sin = model.rope.cos_signed_sin(positions, seq_lens, torch.float32)
        cos, sin = cos.contiguous(), sin.contiguous()
        pointers = (t.data_ptr() for t in (cos, sin, write_slots, rows, offsets, slots))
        if self._fn(self._layers, len(self._layers), ctypes.byref(self._shape), x.data_ptr(),
                    len(x), *pointers, torch.get_num_threads()):  # fmt: skip
            raise MemoryError(f"decode step: no memory for the work space of {len(x)} rows")
        return model.model.norm(x)  # type: ignore[no-any-return]
