"""Routers that R2R publishes (thu-nics/R2R), read without running pickled code.

R2R saves one router per model pair with `torch.save`, as a dict:

    model_type           "HiddenStatesTokenLMHeadLogitsClassifier" (the one read here)
    init_args            the constructor's arguments as given: hidden_states_size,
                         logits_size (100), hidden_dims ([1024] * 6), expansion_factor (4),
                         normalize_input, use_position_embedding, dropout_rate, ...
    common_args          threshold (route to the large model when sigmoid >= it),
                         input_type ["hidden_states", "token", "logits"]
    model_specific_args  {}
    state_dict           the parameters, without token_embeddings.weight (the small model's
                         embedding table; only their "_all.pt" copy keeps it)

The module, with the state_dict's names (H = hidden_states_size, D = hidden_dims):

    e = token_embeddings(token)                          the small model's input embedding
    normalize_input: h, e = layer_norm_hidden_states(h), layer_norm_token(e); l = softmax(l)
    x = cat(h, e, logits_projection(l))                  l = top-k logits, descending (B, 3H)
    x = backbone.input_projection(combined_projection(x))                          (B, D[0])
    block i (len(D) of them, D[i] -> D[i+1], the last D[-1] -> D[-1]):
        x = dim_change(x) + mlp.3(gelu(mlp.0(layer_norm(x))))   dim_change: identity when
                                                                 the sizes agree; mlp.2/.4
                                                                 are dropouts (off here)
    score = sigmoid(output_layer.1(output_layer.0(x)))   LayerNorm then Linear(D[-1] -> 1)

The file is read with `torch.load(weights_only=True)`, which builds only tensors and
plain containers; every tensor's name and shape is checked against that layout before
use, so a malformed file or one made for another small model fails at start.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trd.policies.params import PolicyError

MODEL_TYPE = "HiddenStatesTokenLMHeadLogitsClassifier"
INPUTS = {"hidden_states", "token", "logits"}
# The constructor's defaults: R2R stores only the arguments that were passed.
DEFAULTS: dict[str, Any] = {
    "hidden_states_size": 1536,
    "logits_size": 100,
    "hidden_dims": [256, 512, 256],
    "expansion_factor": 4,
    "normalize_input": False,
    "use_position_embedding": False,
}
LN_EPS = 1e-5  # torch.nn.LayerNorm's default, which R2R's module uses
Tensors = dict[str, torch.Tensor]


class R2RRouter:
    """R2R's published router as batched tensor ops: (h, e, top-k logits) -> (B,) scores."""

    def __init__(
        self, tensors: Tensors, top_k: int, blocks: int, normalize: bool, threshold: float | None
    ) -> None:
        self.t, self.top_k, self.blocks, self.normalize = tensors, top_k, blocks, normalize
        self.threshold = threshold
        # The small model's table, when the file carries its own copy ("_all.pt").
        self.embed: torch.Tensor | None = tensors.get("token_embeddings.weight")

    def to(self, dtype: torch.dtype, device: torch.device) -> R2RRouter:
        moved = {k: v.to(device, dtype) for k, v in self.t.items()}
        return R2RRouter(moved, self.top_k, self.blocks, self.normalize, self.threshold)

    @property
    def dtype(self) -> torch.dtype:
        return self.t["combined_projection.weight"].dtype

    @property
    def device(self) -> torch.device:
        return self.t["combined_projection.weight"].device

    def _linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.t[f"{name}.weight"], self.t[f"{name}.bias"])

    def _norm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        w = self.t[f"{name}.weight"]
        return F.layer_norm(x, w.shape, w, self.t[f"{name}.bias"], LN_EPS)

    def __call__(self, h: torch.Tensor, e: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        """h (B, H) final-norm hidden, e (B, H) token embedding, top (B, k) -> (B,)."""
        if self.normalize:
            h = self._norm("layer_norm_hidden_states", h)
            e = self._norm("layer_norm_token", e)
            top = torch.softmax(top, dim=-1)
        x = torch.cat([h, e, self._linear("logits_projection", top)], dim=-1)  # (B, 3H)
        x = self._linear("backbone.input_projection", self._linear("combined_projection", x))
        for i in range(self.blocks):
            b = f"backbone.blocks.{i}"
            up = F.gelu(self._linear(f"{b}.mlp.0", self._norm(f"{b}.layer_norm", x)))
            inner = self._linear(f"{b}.mlp.3", up)
            skip = self._linear(f"{b}.dim_change", x) if f"{b}.dim_change.weight" in self.t else x
            x = skip + inner
        x = self._norm("backbone.output_layer.0", x)
        return torch.sigmoid(self._linear("backbone.output_layer.1", x).squeeze(-1))


def is_torch_file(path: Path) -> bool:
    """torch.save writes a zip archive; our heads are safetensors."""
    with Path(path).open("rb") as f:
        return f.read(4) == b"PK\x03\x04"


def expected_shapes(args: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of the state_dict, by name, for these constructor arguments."""
    h, k, dims, x = (args["hidden_states_size"], args["logits_size"], args["hidden_dims"],
                     args["expansion_factor"])  # fmt: skip
    shapes: dict[str, tuple[int, ...]] = {}

    def linear(name: str, fan_in: int, fan_out: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (fan_out, fan_in), (fan_out,)

    def norm(name: str, n: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (n,), (n,)

    if args["normalize_input"]:
        norm("layer_norm_hidden_states", h)
        norm("layer_norm_token", h)
    linear("logits_projection", k, h)
    linear("combined_projection", 3 * h, dims[0])
    linear("backbone.input_projection", dims[0], dims[0])
    for i, (d_in, d_out) in enumerate(zip(dims, [*dims[1:], dims[-1]], strict=True)):
        b = f"backbone.blocks.{i}"
        norm(f"{b}.layer_norm", d_in)
        linear(f"{b}.mlp.0", d_in, d_in * x)
        linear(f"{b}.mlp.3", d_in * x, d_out)
        if d_in != d_out:
            linear(f"{b}.dim_change", d_in, d_out)
    norm("backbone.output_layer.0", dims[-1])
    linear("backbone.output_layer.1", dims[-1], 1)
    return shapes


def load_r2r_router(path: Path, hidden_size: int, vocab: int) -> R2RRouter:
    """The router in R2R's file at `path`, for a small model of this hidden size and
    embedding rows (`vocab`, 0 if unknown); PolicyError (`policy.head`) says what does
    not fit."""

    def bad(reason: str) -> PolicyError:
        return PolicyError(f"policy.head: {str(path)!r}: {reason}")

    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, zipfile.BadZipFile, EOFError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise bad(f"not a weights-only torch file ({first})") from None
    if not isinstance(raw, dict) or not {"model_type", "init_args", "state_dict"} <= set(raw):
        raise bad("expected R2R's dict {model_type, init_args, common_args, state_dict}")
    if raw["model_type"] != MODEL_TYPE:
        raise bad(f"model_type {raw['model_type']!r}: only {MODEL_TYPE} is supported")
    args = _init_args(raw["init_args"], bad)
    if args["hidden_states_size"] != hidden_size:
        raise bad(f"made for a small model of hidden size {args['hidden_states_size']}, this "
                  f"one has {hidden_size}: a router of another model pair")  # fmt: skip
    if vocab and args["logits_size"] > vocab:
        raise bad(f"reads the top {args['logits_size']} logits of a {vocab}-token vocabulary")
    common = raw.get("common_args") or {}
    if not isinstance(common, dict):
        raise bad("common_args: expected a dict")
    inputs = common.get("input_type") or sorted(INPUTS)
    if set([inputs] if isinstance(inputs, str) else inputs) != INPUTS:
        raise bad(f"common_args.input_type {inputs!r}: this model reads {sorted(INPUTS)}")
    threshold = common.get("threshold")
    number = isinstance(threshold, int | float) and not isinstance(threshold, bool)
    if threshold is not None and (not number or not 0 <= threshold <= 1):
        raise bad(f"common_args.threshold {threshold!r}: expected a number in [0, 1] or None")
    tensors = _state_dict(raw["state_dict"], args, hidden_size, vocab, bad)
    tau = None if threshold is None else float(threshold)
    return R2RRouter(tensors, args["logits_size"], len(args["hidden_dims"]),
                     args["normalize_input"], tau)  # fmt: skip


def _init_args(given: Any, bad: Any) -> dict[str, Any]:
    if not isinstance(given, dict):
        raise bad("init_args: expected a dict")
    args = {**DEFAULTS, **given}
    for key in ("hidden_states_size", "logits_size", "expansion_factor"):
        if isinstance(args[key], bool) or not isinstance(args[key], int) or args[key] < 1:
            raise bad(f"init_args.{key} {args[key]!r}: expected an integer >= 1")
    dims = args["hidden_dims"]
    if (
        not isinstance(dims, list | tuple)
        or not dims
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims)
    ):
        raise bad(f"init_args.hidden_dims {dims!r}: expected a non-empty list of integers")
    if args["use_position_embedding"]:
        raise bad("init_args.use_position_embedding: true is not supported (no released "
                  "router uses it)")  # fmt: skip
    if not isinstance(args["normalize_input"], bool):
        raise bad(f"init_args.normalize_input {args['normalize_input']!r}: expected a boolean")
    return args


def _state_dict(sd: Any, args: dict[str, Any], hidden_size: int, vocab: int, bad: Any) -> Tensors:
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise bad("state_dict: expected a dict of tensors")
    want = expected_shapes(args)
    for name, shape in want.items():
        if name not in sd:
            raise bad(f"state_dict: missing tensor {name!r}")
        if tuple(sd[name].shape) != shape:
            raise bad(f"state_dict: {name!r} has shape {tuple(sd[name].shape)}, the layout "
                      f"of init_args needs {shape}")  # fmt: skip
    table = sd.get("token_embeddings.weight")
    if table is not None and (table.dim() != 2 or table.shape[1] != hidden_size
                              or table.shape[0] < vocab):  # fmt: skip
        raise bad(f"state_dict: token_embeddings.weight {tuple(table.shape)} is not a "
                  f"({vocab}+, {hidden_size}) embedding table")  # fmt: skip
    extra = sorted(set(sd) - set(want) - {"token_embeddings.weight"})
    if extra:
        raise bad(f"state_dict: unexpected tensors {extra[:4]} for {MODEL_TYPE}")
    return {k: v.detach().float() for k, v in sd.items()}
