"""The reference loop: one request at a time, no batching, transformers models.

It runs the daemon's semantics (the vocabulary cut, the grammar mask, the early-stop ban,
sampling, each policy's decision rule) in its own, simpler code (reference_sampling.py,
reference_rules.py here: of trd/policies only the router heads' file readers, nothing of
the engines' sampler or masks), and none of the runtime: no paging, no anchors, no
pending KV, no rings. The oracle (tests, float64): each position recomputes the whole
sequence from scratch on the current model. The research-code baseline (benchmarks, the GPU check;
`kv_cache=True`): what the R2R and CITER repositories do, a `DynamicCache` per request
and model, and a model that gets the request back first catches its cache up on the
tokens it has not seen.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, PreTrainedModel

from trd.models.checkpoint import Checkpoint, read_checkpoint
from trd.models.loader import read_weights
from trd.models.quantize import quantise_loaded, replace_layers
from trd.policies.params import PolicySpec
from trd.protocol import FinishReason, SamplingParams
from trd.testing.reference_rules import OwnRouting, Position, make_rule
from trd.testing.reference_sampling import GrammarMask, draw, stop_ids


def _load(path: Path, dtype: torch.dtype, device: str, quantization: str) -> PreTrainedModel:
    """transformers' model; with a quantised checkpoint (or `quantization` for a float one)
    its matrices are our quantised layers, which in float64 compute exactly what the
    engines' kernel does (`trd/models/qlinear.py`)."""
    ckpt = read_checkpoint(path)
    model: PreTrainedModel
    if ckpt.quantization == "none":
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
        if quantization != "none":
            quantise_loaded(model, quantization, ckpt.config.tie_word_embeddings)
    else:
        model = _quantised_model(path, ckpt, dtype)
    # transformers decorates PreTrainedModel.to with functools.wraps(nn.Module.to), whose
    # stub (functools._Wrapped) binds no self: mypy would take the device for `self`.
    to = cast(Callable[[str], PreTrainedModel], model.to)
    return to(device).eval()


def _quantised_model(path: Path, ckpt: Checkpoint, dtype: torch.dtype) -> PreTrainedModel:
    """A quantised checkpoint in transformers' model: built empty, then filled (the CPU)."""
    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    floats, quantised = read_weights(ckpt, dtype, torch.device("cpu"))
    biases = {n: floats.pop(f"{n}.bias") for n in quantised if f"{n}.bias" in floats}
    replace_layers(model, quantised, biases, torch.device("cpu"), dtype,
                   ckpt.config.tie_word_embeddings)  # fmt: skip
    model.load_state_dict(floats, assign=True, strict=False)
    for name, module in list(model.named_modules()):  # derived buffers, made for real
        if name.endswith("rotary_emb"):  # transformers 5 takes no device argument
            with torch.device("cpu"):
                model.set_submodule(name, type(module)(config=config))
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"{path}: the reference model has no weights for {left[:5]}")
    return model


@dataclass
class Trace:
    tokens: list[int] = field(default_factory=list)
    models: list[int] = field(default_factory=list)  # producer of each token
    finish: FinishReason = FinishReason.NONE
    fed: dict[int, int] = field(default_factory=dict)  # model -> longest sequence it ran on
    forwards: int = 0
    ttft: float = 0.0  # seconds to the first committed token
    latency: float = 0.0  # seconds to the end


class ReferenceRouter:
    def __init__(
        self,
        paths: Sequence[Path],
        policy: PolicySpec,
        dtype: str = "float64",
        device: str = "cpu",
        kv_cache: bool = False,
        quantization: str = "none",
    ) -> None:
        self.device, self.kv_cache = torch.device(device), kv_cache
        self.paths = [Path(p) for p in paths]
        self.models = [_load(p, getattr(torch, dtype), device, quantization) for p in paths]
        entry = read_checkpoint(Path(paths[0]))
        self.eos = entry.config.eos_token_ids
        self.vocab = entry.vocab_limit  # as the engines: padding rows are never sampled
        self.tokenizer_json = Path(paths[0]) / "tokenizer.json"
        self.rule = make_rule(policy, paths, self.models[0].get_input_embeddings())

    def with_policy(self, policy: PolicySpec) -> ReferenceRouter:
        """The same models routed by another policy (loaded once for several)."""
        other = copy.copy(self)
        other.rule = make_rule(policy, self.paths, self.models[0].get_input_embeddings())
        return other

    @torch.inference_mode()
    def run(self, prompt: Sequence[int], params: SamplingParams) -> Trace:
        start = time.perf_counter()
        pin = params.routing.model  # the request's own model writes every token
        seq, trace, cur = list(prompt), Trace(), pin or 0
        last, own = len(self.models) - 1, OwnRouting()
        caches = [DynamicCache() if self.kv_cache else None for _ in self.models]
        grammar = (
            GrammarMask(self.tokenizer_json, self.eos, params.grammar) if params.grammar else None
        )
        while True:
            cache = caches[cur]
            seen = cache.get_seq_length() if cache is not None else 0
            feed = torch.tensor([seq[seen:]], device=self.device)
            # logits_to_keep: only the last position's logits (a prefill's full logits are
            # positions x vocabulary, 151,936 wide for Qwen: as costly as the layers).
            out = self.models[cur](feed, cache=cache, output_hidden_states=True, logits_to_keep=1)
            logits, hidden = out.logits[0, -1, : self.vocab], out.hidden_states[-1][0, -1]
            banned = stop_ids(params, self.eos, len(trace.tokens))
            if grammar is not None:
                allowed = grammar.allowed(trace.tokens, banned, logits.shape[0]).to(logits.device)
                if not bool(allowed.any()):
                    trace.finish = FinishReason.ERROR  # the grammar allows no next token
                    return trace
                logits = logits.masked_fill(~allowed, -torch.inf)
            logits = logits.clone()
            logits[[t for t in banned if t < logits.shape[0]]] = -torch.inf
            token = draw(logits, params, len(seq))
            trace.forwards += 1
            trace.fed[cur] = len(seq)
            large = sum(m == last for m in trace.models)
            at = Position(cur, logits, hidden, token, prompt, trace.tokens, params, large, own)
            dst, keep = (pin, cur == pin) if pin is not None else self.rule(at)
            if keep:
                seq.append(token)
                trace.tokens.append(token)
                trace.models.append(cur)
                trace.ttft = trace.ttft or time.perf_counter() - start
                if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos):
                    trace.finish = FinishReason.STOP
                elif len(trace.tokens) >= params.max_tokens:
                    trace.finish = FinishReason.LENGTH
                if trace.finish is not FinishReason.NONE:
                    trace.latency = time.perf_counter() - start
                    return trace
            cur = dst
