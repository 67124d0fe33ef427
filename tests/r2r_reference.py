"""R2R's HiddenStatesTokenLMHeadLogitsClassifier rebuilt from its description, and router
files built with it in R2R's `torch.save` layout (random weights).

Rebuilt from thu-nics/R2R r2r/models/router.py's structure: the same submodules under the
same attribute names, so `state_dict()` has exactly the names and shapes their files hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

VOCAB, TOP = 2048, 100
HIDDEN = 64  # the fixture small model's


class Block(nn.Module):
    def __init__(self, d_in: int, d_out: int, expansion: int) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(d_in)
        self.mlp = nn.Sequential(nn.Linear(d_in, d_in * expansion), nn.GELU(), nn.Dropout(0.1),
                                 nn.Linear(d_in * expansion, d_out), nn.Dropout(0.1))  # fmt: skip
        self.dim_change = nn.Linear(d_in, d_out) if d_in != d_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dim_change(x) + self.mlp(self.layer_norm(x))


class Backbone(nn.Module):
    def __init__(self, dims: list[int], expansion: int) -> None:
        super().__init__()
        self.input_projection = nn.Linear(dims[0], dims[0])
        outs = [*dims[1:], dims[-1]]
        self.blocks = nn.ModuleList(Block(a, b, expansion) for a, b in zip(dims, outs, strict=True))
        self.output_layer = nn.Sequential(nn.LayerNorm(dims[-1]), nn.Linear(dims[-1], 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.input_projection(x)
        for block in self.blocks:
            x = block(x)
        return self.output_layer(x)


class HiddenStatesTokenLMHeadLogitsClassifier(nn.Module):
    def __init__(self, hidden: int, logits_size: int, dims: list[int], normalize: bool) -> None:
        super().__init__()
        self.normalize = normalize
        if normalize:
            self.layer_norm_hidden_states = nn.LayerNorm(hidden)
            self.layer_norm_token = nn.LayerNorm(hidden)
        self.token_embeddings = nn.Embedding(VOCAB, hidden)
        self.logits_projection = nn.Linear(logits_size, hidden)
        self.combined_projection = nn.Linear(3 * hidden, dims[0])
        self.backbone = Backbone(dims, 4)

    def forward(self, hidden: torch.Tensor, token: torch.Tensor, logits: torch.Tensor) -> Any:
        emb = self.token_embeddings(token)
        if self.normalize:
            hidden = self.layer_norm_hidden_states(hidden)
            emb = self.layer_norm_token(emb)
            logits = torch.softmax(logits, dim=-1)
        x = torch.cat([hidden, emb, self.logits_projection(logits)], dim=-1)
        return self.backbone(self.combined_projection(x))


def build(
    path: Path, dims: list[int], normalize: bool = False, threshold: float | None = 0.5,
    hidden: int = HIDDEN, seed: int = 0, **overrides: Any,
) -> HiddenStatesTokenLMHeadLogitsClassifier:  # fmt: skip
    """A router in R2R's file layout, every parameter random (LayerNorms included)."""
    torch.manual_seed(seed)
    module = HiddenStatesTokenLMHeadLogitsClassifier(hidden, TOP, dims, normalize).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * p.shape[-1] ** -0.5 + (0.5 if p.dim() == 1 else 0))
        out = module.backbone.output_layer[1]
        assert isinstance(out, nn.Linear)
        out.weight.mul_(8.0)  # scores spread across (0, 1) around the middle
        out.bias.zero_()
    state = {k: v for k, v in module.state_dict().items() if k != "token_embeddings.weight"}
    init_args = {"hidden_states_size": hidden, "logits_size": TOP, "hidden_dims": dims,
                 "expansion_factor": 4, "dropout_rate": 0.1, "use_position_embedding": False,
                 "freeze_lm_head": True, "normalize_input": normalize,
                 "pretrained_model_name": "tiny/small"}  # fmt: skip
    blob = {
        "model_type": "HiddenStatesTokenLMHeadLogitsClassifier",
        "init_args": init_args,
        "common_args": {"threshold": threshold, "input_type": ["hidden_states", "token", "logits"]},
        "model_specific_args": {},
        "state_dict": state,
    }
    for key, value in overrides.items():
        blob[key] = value(blob[key]) if callable(value) else value
    torch.save(blob, path)
    return module
