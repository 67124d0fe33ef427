"""Put quantised layers into a `CausalLM`: a quantised checkpoint's own, or a float
checkpoint's weights quantised at load (round to nearest, `trd/models/quantization.py`
says which bits); then q, k, v and gate, up become one call each where their bits agree.

On CUDA (untested on a GPU so far) only 4-bit weights stay quantised, through torch's
`_weight_int4pack_mm`; 8-bit ones are dequantised to the serving dtype, torch shipping no
grouped int8 kernel there.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from trd.models import qkernel
from trd.models.model import MLP, Attention, CausalLM, DecoderLayer, RMSNorm
from trd.models.qformat import GROUP, QuantTensor, quantize
from trd.models.qlinear import QuantEmbedding, QuantLinear, fuse
from trd.models.quantization import EMBEDDING, HEAD, bits_for, quantised_name


def quantise_loaded(model: nn.Module, mode: str, tied: bool) -> None:
    """Quantise a float model's matrices in place (`mode` int8 or int4): a `CausalLM`, or
    transformers' model of the same names (the reference loop's)."""
    quantised: dict[str, QuantTensor] = {}
    biases: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear | nn.Embedding) and quantised_name(name):
            quantised[name] = quantize(module.weight, bits_for(name, mode))
            if isinstance(module, nn.Linear) and module.bias is not None:
                biases[name] = module.bias
    weight = model.get_submodule(EMBEDDING).weight
    assert isinstance(weight, torch.Tensor)
    replace_layers(model, quantised, biases, weight.device, weight.dtype, tied)
    if isinstance(model, CausalLM) and weight.device.type == "cpu":
        fuse_layers(model)
        go_native(model)


def install(
    model: CausalLM,
    quantised: dict[str, QuantTensor],
    biases: dict[str, torch.Tensor],
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    """A quantised checkpoint's layers into `model`; on the CPU, q/k/v and gate/up fused."""
    replace_layers(model, quantised, biases, device, dtype, model.cfg.tie_word_embeddings)
    if device.type == "cpu":
        fuse_layers(model)
        go_native(model)


def go_native(model: CausalLM) -> None:
    """The norms, rotary embeddings and SiLU * up of a quantised model on the CPU run
    through the kernel's library (float32; one call each instead of several torch calls)."""
    native = qkernel.load()
    for module in model.modules():
        if isinstance(module, RMSNorm | Attention | MLP):
            module.native = native


def replace_layers(
    model: nn.Module,
    quantised: dict[str, QuantTensor],
    biases: dict[str, torch.Tensor],
    device: torch.device,
    dtype: torch.dtype,
    tied: bool,
) -> None:
    """Replace the layers named in `quantised` (a tied head: the embedding table's own
    linear); activations are `dtype`."""
    for name, qt in quantised.items():
        if device.type == "cuda":
            module: nn.Module = _cuda_layer(name, qt, biases.get(name), dtype, device)
        elif name == EMBEDDING:
            module = QuantEmbedding(qt, dtype)
        else:
            module = QuantLinear(qt, biases.get(name))
        model.set_submodule(name, module)
        if name == EMBEDDING and tied and HEAD not in quantised:
            model.register_module(HEAD, module.head if isinstance(module, QuantEmbedding) else None)


def fuse_layers(model: CausalLM) -> None:
    for layer in model.model.layers:
        assert isinstance(layer, DecoderLayer)
        attn, mlp = layer.self_attn, layer.mlp
        parts = [attn.q_proj, attn.k_proj, attn.v_proj]
        if all(isinstance(p, QuantLinear) for p in parts):
            attn.qkv_proj = fuse(cast(list[QuantLinear], parts))
            if attn.qkv_proj is not None:
                del attn.q_proj, attn.k_proj, attn.v_proj
        pair = [mlp.gate_proj, mlp.up_proj]
        if all(isinstance(p, QuantLinear) for p in pair):
            mlp.gate_up_proj = fuse(cast(list[QuantLinear], pair))
            if mlp.gate_up_proj is not None:
                del mlp.gate_proj, mlp.up_proj


def _cuda_layer(
    name: str, qt: QuantTensor, bias: torch.Tensor | None, dtype: torch.dtype,
    device: torch.device,
) -> nn.Module:  # fmt: skip
    if name == EMBEDDING:
        return nn.Embedding.from_pretrained(qt.dequantize(dtype).to(device), freeze=True)
    if qt.bits == 4 and dtype == torch.bfloat16:
        return CudaInt4Linear(qt, bias, device)
    n, k = qt.shape
    linear = nn.Linear(k, n, bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(qt.dequantize(dtype).to(device), requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias.to(dtype).to(device), requires_grad=False)
    return linear


class CudaInt4Linear(nn.Module):
    """4-bit weights through torch's CUDA int4 kernel: w = (q - 8) * s + z with z = 8s - m.
    Untested on a GPU."""

    def __init__(self, qt: QuantTensor, bias: torch.Tensor | None, device: torch.device) -> None:
        super().__init__()
        q = qt.values().to(device)
        packed = (q[:, ::2] << 4 | q[:, 1::2]).contiguous()
        self.weight = torch._convert_weight_to_int4pack(packed, 8)
        s = qt.scales.to(torch.float32)
        z = 8 * s - (qt.mins.to(torch.float32) if qt.mins is not None else 0)
        pairs = torch.stack((s.t(), z.t()), dim=-1).to(torch.bfloat16)
        self.scales_zeros = pairs.contiguous().to(device)
        self.bias = None if bias is None else bias.to(torch.bfloat16).to(device)
        self.out_features = qt.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        y = torch._weight_int4pack_mm(rows, self.weight, GROUP, self.scales_zeros)
        y = y if self.bias is None else y + self.bias
        return y.view(*x.shape[:-1], self.out_features)
