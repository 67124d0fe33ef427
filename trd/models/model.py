"""Decoder-only transformer for the Qwen3, Qwen2 and Llama families over a paged KV cache.

Parameter names mirror the Hugging Face layout (`model.layers.N.self_attn.q_proj.weight`,
...) so a checkpoint's state dict loads without renaming. Tokens of all requests in a
step are packed along one axis (T = total new tokens); the attention backend knows
which tokens belong to which request and where their KV pages are.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trd.models.attention.base import AttentionBackend
from trd.models.checkpoint import ModelConfig
from trd.models.qkernel import Kernel
from trd.models.rotary import RotaryEmbedding


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.native: Kernel | None = None  # quantised models on the CPU (quantize.py)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None and x.dtype == torch.float32 and x.is_contiguous():
            return self.native.rmsnorm(x, self.weight, self.eps)
        if x.dtype == torch.float32:  # torch's fused kernel: the same bits, one call
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalise in float32 whatever the model dtype, exactly as the reference
        # implementation does, so float64 runs match it bit for bit.
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (T, heads, D) rotated by the per-token cos and signed sin (T, 1, D) of
    `RotaryEmbedding.cos_signed_sin`: x * cos + [x2, x1] * [-sin, sin], four calls."""
    t, h, d = x.shape
    swapped = x.view(t, h, 2, d // 2).flip(2).view(t, h, d)
    return x * cos + swapped * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        q_out, kv_out = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_out, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_out, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_out, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_out, cfg.hidden_size, bias=cfg.o_bias)
        # Quantised models compute q, k and v in one call (trd/models/quantize.py: fuse),
        # and on the CPU in float32 rotate q and k in place (`native`).
        self.qkv_proj: nn.Module | None = None
        self.native: Kernel | None = None
        self.qkv_split = (q_out, kv_out, kv_out)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        backend: AttentionBackend,
        kv_cache: torch.Tensor,
    ) -> torch.Tensor:
        t, h, kvh, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_proj is not None and not self.qk_norm:  # rotate q and k in one pass
            qkv = self.qkv_proj(x)
            qk = qkv[:, : (h + kvh) * d].view(t, h + kvh, d)
            if self.native is not None and qkv.dtype == torch.float32:
                self.native.rope_(qk, *rope)
            else:
                qk = apply_rope(qk, *rope)
            q, k = qk[:, :h], qk[:, h:]
            v = qkv[:, (h + kvh) * d :].view(t, kvh, d)
        else:
            if self.qkv_proj is None:
                q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            else:
                q, k, v = self.qkv_proj(x).split(self.qkv_split, dim=-1)
            q, k, v = q.reshape(t, h, d), k.reshape(t, kvh, d), v.reshape(t, kvh, d)
            if self.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            if self.native is not None and q.dtype == torch.float32:  # both contiguous
                self.native.rope_(q, *rope)
                self.native.rope_(k, *rope)
            else:
                q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out = backend.attend(q, k, v, kv_cache)  # (T, H, D)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.gate_up_proj: nn.Module | None = None  # gate and up in one call (quantised)
        self.native: Kernel | None = None  # quantised models on the CPU: SiLU * up in one call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        if self.native is not None and gate.dtype == torch.float32 and gate.dim() == 2:
            return self.down_proj(self.native.silu_mul(gate, up))
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        backend: AttentionBackend,
        kv_cache: torch.Tensor,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, backend, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # Built on the meta device and loaded after: `_weight` skips the random init, whose
        # normal_ on meta goes through torch._refs and imports torch._dynamo (2.5 s of
        # CPU on every engine start).
        table = torch.empty(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=table)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """`forward` maps packed new tokens to final-norm hidden states; `logits` projects rows."""

    lm_head: nn.Module | None

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = DecoderStack(cfg)
        # Frequencies, no weights: the loader rebuilds it on the serving device.
        self.rope = RotaryEmbedding(cfg.rope, cfg.head_dim, torch.device("cpu"))
        # Tied embeddings: None, the logits read the embedding matrix (a quantised model
        # sets the quantised table's own linear here).
        tied = cfg.tie_word_embeddings
        head = None if tied else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_module("lm_head", head)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        backend: AttentionBackend,
        kv_caches: list[torch.Tensor],
        seq_lens: np.ndarray,
    ) -> torch.Tensor:
        # input_ids, positions: (T,) -> hidden: (T, hidden). seq_lens (T,): the sequence
        # length each token's feed catches up to (the dynamic rope variant reads it).
        x = self.model.embed_tokens(input_ids)
        rope = self.rope.cos_signed_sin(positions, seq_lens, x.dtype)  # once per step
        for layer, cache in zip(self.model.layers, kv_caches, strict=True):
            x = layer(x, rope, backend, cache)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head(hidden)  # type: ignore[no-any-return]
        return F.linear(hidden, self.model.embed_tokens.weight)
