"""Random-weight checkpoints with the exact shapes of Qwen3-0.6B and Qwen3-8B (and of the
demo pair, Qwen2.5-0.5B and -1.5B), made in seconds, and the tokens they write.

    python -m trd.testing.shaped DEST [--models 0.6b,8b] [--device cuda] [--layers N]

Writes DEST/qwen3-0.6b-shaped/ and DEST/qwen3-8b-shaped/: config.json, sharded bf16
safetensors with model.safetensors.index.json, the tokenizer. Each tensor is made, cast
and written shard by shard (`--shard-mib`), so a host with little RAM can make the 16 GB
8B; `--device cuda` draws the numbers on a GPU (much faster) and writes them the same way.
The GPU check (scripts/gpu_check.sh) and `tokenrouterd bench compare --plan gpu` make them
on the device; the tests make small ones.

Shapes: Qwen's published config.json of each model (head_dim 128, GQA 16/8 and 32/8,
qk-norm, vocab 151936, rope_theta 1e6, context 40960; 0.6B ties its LM head to the
embedding, 8B does not): 596,049,920 and 8,190,735,360 parameters.

`--layers N` keeps every published size but the depth (the GPU check writes 2 layers of
each, in seconds: enough for the kernels, the graphs and the memory plan).

Tokenizer: both share the fixture tokenizer of trd/testing/tinymodels (2048 ids, EOS 0; the
checkpoints' eos_token_id is set to it). Its ids are a prefix of the 151936 embedding
rows, as Qwen's own 151669 tokens are; the rows past it are never produced by it.

Weights are random but shaped so that greedy decoding has wide margins, so bf16 rounding
cannot flip a token between two correct runs (graphs on vs off, flashinfer vs torch):
embedding rows ~ N(0, 1), so the residual stream starts far from the origin; q/k/v,
gate and up ~ N(0, 0.02^2); o_proj and down_proj ~ N(0, 0.02^2 / (2 x layers)), so the
layers add a small, context-dependent part; norms 1. The LM head makes the next token
the current one (0.6B, tied) or the current one + 1 modulo the tokenizer's vocabulary
(8B: its row j is the embedding row of j - 1): the two models write different tokens,
so a routed response shows which model made each position (`expected_tokens`). The
margins are so wide (hundreds of nats at the published widths) that every other token's
probability is exactly 0 in float32: entropies are exactly 0 at every position.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from trd.policies.params import PolicySpec
from trd.protocol import SamplingParams
from trd.testing.tinymodels.cache import ensure_tokenizer
from trd.testing.tinymodels.tokenizer import EOS_ID, VOCAB_SIZE, save_tokenizer


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool
    head_dim: int = 128
    vocab: int = 151936
    family: str = "qwen3"  # or "qwen2": q/k/v biases, no qk-norm (Qwen2.5, the demo pair)

    def config(self) -> dict[str, object]:
        """Qwen3's or Qwen2's config.json fields, with this shape (EOS: the shared
        tokenizer's)."""
        if self.family == "qwen2":
            return {
                "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": EOS_ID,
                "hidden_act": "silu", "hidden_size": self.hidden, "initializer_range": 0.02,
                "intermediate_size": self.intermediate, "max_position_embeddings": 32768,
                "max_window_layers": self.layers, "num_attention_heads": self.heads,
                "num_hidden_layers": self.layers, "num_key_value_heads": self.kv_heads,
                "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0,
                "sliding_window": None, "tie_word_embeddings": self.tied,
                "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
                "vocab_size": self.vocab,
            }  # fmt: skip
        return {
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None,
            "eos_token_id": EOS_ID, "head_dim": self.head_dim, "hidden_act": "silu",
            "hidden_size": self.hidden, "initializer_range": 0.02,
            "intermediate_size": self.intermediate, "max_position_embeddings": 40960,
            "max_window_layers": self.layers, "num_attention_heads": self.heads,
            "num_hidden_layers": self.layers, "num_key_value_heads": self.kv_heads,
            "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
            "sliding_window": None, "tie_word_embeddings": self.tied, "torch_dtype": "bfloat16",
            "use_cache": True, "use_sliding_window": False, "vocab_size": self.vocab,
        }  # fmt: skip

    def tensors(self) -> Iterator[tuple[str, tuple[int, ...], float]]:
        """(name, shape, std) in file order; std 0 = ones (norms), -1 = the LM head."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        out_std = 0.02 / math.sqrt(2 * self.layers)
        yield "model.embed_tokens.weight", (self.vocab, h), 1.0
        if not self.tied:
            yield "lm_head.weight", (self.vocab, h), -1.0
        for i in range(self.layers):
            p = f"model.layers.{i}."
            yield p + "input_layernorm.weight", (h,), 0.0
            yield p + "self_attn.q_proj.weight", (q, h), 0.02
            yield p + "self_attn.k_proj.weight", (kv, h), 0.02
            yield p + "self_attn.v_proj.weight", (kv, h), 0.02
            yield p + "self_attn.o_proj.weight", (h, q), out_std
            if self.family == "qwen2":
                yield p + "self_attn.q_proj.bias", (q,), 0.02
                yield p + "self_attn.k_proj.bias", (kv,), 0.02
                yield p + "self_attn.v_proj.bias", (kv,), 0.02
            else:
                yield p + "self_attn.q_norm.weight", (self.head_dim,), 0.0
                yield p + "self_attn.k_norm.weight", (self.head_dim,), 0.0
            yield p + "post_attention_layernorm.weight", (h,), 0.0
            yield p + "mlp.gate_proj.weight", (self.intermediate, h), 0.02
            yield p + "mlp.up_proj.weight", (self.intermediate, h), 0.02
            yield p + "mlp.down_proj.weight", (h, self.intermediate), out_std
        yield "model.norm.weight", (h,), 0.0

    def num_params(self) -> int:
        return sum(math.prod(shape) for _, shape, _ in self.tensors())


SHAPES = {
    "0.6b": Shape("qwen3-0.6b-shaped", 1024, 3072, 28, 16, 8, tied=True),
    "8b": Shape("qwen3-8b-shaped", 4096, 12288, 36, 32, 8, tied=False),
    # The demo pair's shapes (Qwen2.5-Coder-0.5B and -1.5B-Instruct). Both tie their LM
    # head when published; the 1.5B here does not, so that it writes token + 1.
    "qwen2.5-0.5b": Shape("qwen2.5-0.5b-shaped", 896, 4864, 24, 14, 2, tied=True,
                          head_dim=64, family="qwen2"),
    "qwen2.5-1.5b": Shape("qwen2.5-1.5b-shaped", 1536, 8960, 28, 12, 2, tied=False,
                          family="qwen2"),
}  # fmt: skip


def tiny(shape: Shape, layers: int = 2) -> Shape:
    """A CPU stand-in of `shape`: the same construction (tied repeats, untied adds one,
    the same family) at a small width, wide enough that its margins (~190 nats) still
    leave every other token's probability exactly 0 in float32."""
    return dataclasses.replace(shape, name=f"tiny-{shape.name}", hidden=256, intermediate=512,
                               layers=layers, heads=4, kv_heads=2, head_dim=64,
                               vocab=4096)  # fmt: skip


def expected_tokens(prompt: Sequence[int], n: int, schedule: Sequence[int]) -> list[int]:
    """What a shaped pair (tied small, untied large) writes when model schedule[p % len]
    makes output position p: the large one (1) adds 1 to the current token."""
    out, cur = [], prompt[-1]
    for p in range(n):
        cur = (cur + schedule[p % len(schedule)]) % VOCAB_SIZE
        out.append(cur)
    return out


# The GPU check's routed workload for the shaped pair: the schedule [1, 0, 0, 1, 1, 0]
# hands requests over at every kind of position (the first output token is the large
# model's, later ones alternate in runs of one and two, and the output lengths end on
# either model).
SCHEDULE = [1, 0, 0, 1, 1, 0]
POLICY = PolicySpec("scripted", {"schedule": SCHEDULE})
Job = tuple[list[int], SamplingParams]


def jobs(count: int = 12, max_tokens: Sequence[int] = (1, 2, 3, 5, 6, 7, 12, 33)) -> list[Job]:
    """Prompts of 3..60 ids of the shared tokenizer; output lengths ending on both models."""
    return [
        ([(7 * i + 13 * j) % (VOCAB_SIZE - 1) + 1 for j in range(3 + (i * 11) % 58)],
         SamplingParams(max_tokens=max_tokens[i % len(max_tokens)], ignore_eos=True))
        for i in range(count)
    ]  # fmt: skip


def make_tensor(name: str, shape: tuple[int, ...], std: float, dev: str) -> torch.Tensor:
    """The tensor `name`, drawn from a generator seeded by its name (order-independent)."""
    if std == 0.0:
        return torch.ones(shape, dtype=torch.bfloat16)
    if std < 0:  # the untied LM head: row j is embedding row j - 1 within the tokenizer
        emb = make_tensor("model.embed_tokens.weight", shape, 1.0, dev)
        return torch.cat([emb[:VOCAB_SIZE].roll(1, dims=0), emb[VOCAB_SIZE:]])
    gen = torch.Generator(dev).manual_seed(zlib.crc32(name.encode()))
    x = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).mul_(std)
    return x.to(torch.bfloat16).cpu()


def write_checkpoint(
    shape: Shape, dest: Path, device: str = "cpu", shard_bytes: int = 2 << 30
) -> Path:
    """The checkpoint of `shape` in dest/shape.name, written one shard at a time."""
    out = dest / shape.name
    out.mkdir(parents=True, exist_ok=True)
    shards: list[list[tuple[str, tuple[int, ...], float]]] = [[]]
    size = 0
    for entry in shape.tensors():  # plan the shards first: their count is in every name
        nbytes = math.prod(entry[1]) * 2
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: make_tensor(n, s, std, device) for n, s, std in shard}, out / file,
                  metadata={"format": "pt"})  # fmt: skip
        weight_map |= {n: file for n, _, _ in shard}
    index = {"metadata": {"total_size": shape.num_params() * 2}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    (out / "config.json").write_text(json.dumps(shape.config(), indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS_ID}))
    save_tokenizer(ensure_tokenizer(), out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--models", default="0.6b,8b", help=f"comma-separated: {', '.join(SHAPES)}")
    ap.add_argument("--device", default="cpu", help="where to draw the numbers (cpu, cuda)")
    ap.add_argument("--shard-mib", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=0, help="layers of each (0: published)")
    args = ap.parse_args()
    for key in args.models.split(","):
        shape = SHAPES[key]
        if args.layers:
            shape = dataclasses.replace(shape, layers=args.layers)
        path = write_checkpoint(shape, args.dest, args.device, args.shard_mib << 20)
        print(f"{path}: {shape.num_params():,} parameters")


if __name__ == "__main__":
    main()
