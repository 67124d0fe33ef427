"""Import a llama.cpp GGUF file as an HF checkpoint directory (ours and transformers' format).

    import_gguf(Path("model.gguf"), Path("models/m"), dtype="float32")
    tokenrouterd import-gguf model.gguf models/m [--dtype bfloat16] [--force]

    out_dir/  config.json  generation_config.json  model.safetensors
              tokenizer.json  tokenizer_config.json (special tokens, chat template)

Supported: architectures llama, qwen2, qwen3 (`general.architecture`) with default rope
and full rotary dimension; tensor types F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (dequantised by the gguf package, then cast to dtype);
byte-level BPE tokenizers (`tokenizer.ggml.model` gpt2). Anything else fails with a
GGUFImportError naming the file and the architecture, type or key at fault.

llama.cpp rotates adjacent pairs (x0, x1), HF rotates halves (x_i, x_{i+d/2}), so its
converter permutes the rows of each llama-arch Q and K head to interleave the halves:

    HF rows of one head:    [a0 a1 .. a(d/2-1) | b0 b1 .. b(d/2-1)]
    GGUF rows of that head: [a0 b0 a1 b1 .. a(d/2-1) b(d/2-1)]

`_unpermute` undoes it. Qwen2/Qwen3 use the half-split ("NEOX") layout in llama.cpp too,
so their tensors are stored as HF has them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, ReaderTensor
from gguf.quants import dequantize
from safetensors.torch import save_file
from tqdm import tqdm

from trd.models.cache import readable_by_all
from trd.models.gguf_meta import GGUFImportError, GGUFMeta
from trd.models.gguf_quant import gguf_quant
from trd.models.gguf_tokenizer import save_tokenizer
from trd.models.quantization import MODES, marker, quantised_name

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
DTYPES = ("float32", "bfloat16", "float16")
_QUANT_NAMES = "F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K"
QUANT_TYPES = tuple(GGMLQuantizationType[name] for name in _QUANT_NAMES.split())

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    **{f"attn_{g}.{p}": f"self_attn.{h}_proj.{p}" for g, h in
       (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o")) for p in ("weight", "bias")},
    **{f"ffn_{g}.weight": f"mlp.{g}_proj.weight" for g in ("gate", "up", "down")},
}  # fmt: skip


def _expected_layer_tensors(arch: str) -> set[str]:
    names = {"attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output"}
    names |= {"ffn_gate", "ffn_up", "ffn_down"}
    expected = {f"{n}.weight" for n in names}
    if arch == "qwen2":
        expected |= {"attn_q.bias", "attn_k.bias", "attn_v.bias"}
    if arch == "qwen3":
        expected |= {"attn_q_norm.weight", "attn_k_norm.weight"}
    return expected


def _config(meta: GGUFMeta, vocab_size: int, tied: bool, dtype: str) -> dict[str, Any]:
    hidden = meta.arch_int("embedding_length")
    heads = meta.arch_int("attention.head_count")
    head_dim = meta.arch_int("attention.key_length", hidden // heads)
    rotary = meta.arch_int("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise GGUFImportError(
            f"{meta.src}: {meta.arch}.rope.dimension_count {rotary} != head dim {head_dim}"
            " (partial rotary embeddings are not supported)"
        )
    scaling = meta.get(f"{meta.arch}.rope.scaling.type", str, "none")
    if scaling != "none":
        raise GGUFImportError(
            f"{meta.src}: {meta.arch}.rope.scaling.type {scaling!r} is not supported (only none)"
        )
    layers = meta.arch_int("block_count")
    theta = meta.arch_float("rope.freq_base", 10000.0)
    cfg: dict[str, Any] = {
        "architectures": [ARCHITECTURES[meta.arch]],
        "model_type": meta.arch,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": meta.arch_int("feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": meta.arch_int("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": meta.arch_int("context_length"),
        "rms_norm_eps": meta.arch_float("attention.layer_norm_rms_epsilon"),
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "tie_word_embeddings": tied,
        "attention_bias": False,  # qwen2's q/k/v biases are implied by its model_type
        "dtype": dtype,
        **_token_ids(meta),
    }
    if meta.arch != "llama":
        cfg |= {"use_sliding_window": False, "sliding_window": None, "max_window_layers": layers}
    return cfg


def _token_ids(meta: GGUFMeta) -> dict[str, Any]:
    """bos/eos/pad ids; eos lists the end-of-turn token too where the file names one."""
    eos = [meta.get(f"tokenizer.ggml.{k}_token_id", int, None) for k in ("eos", "eot")]
    eos = list(dict.fromkeys(e for e in eos if e is not None))
    return {
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id", int, None),
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id", int, None),
    }


def _hf_name(name: str) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    if m and m[2] in _LAYER_NAMES:
        return f"model.layers.{m[1]}.{_LAYER_NAMES[m[2]]}"
    return None


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows (heads * d, ...) from llama.cpp's interleaved pair order back to HF's halves."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _check_tensors(meta: GGUFMeta, tensors: dict[str, ReaderTensor]) -> None:
    layers = meta.arch_int("block_count")
    per_layer = _expected_layer_tensors(meta.arch)
    expected = {"token_embd.weight", "output_norm.weight"}
    expected |= {f"blk.{i}.{n}" for i in range(layers) for n in per_layer}
    found = set(tensors) - {"output.weight"}  # absent when the embeddings are tied
    if found != expected:
        missing, unexpected = sorted(expected - found), sorted(found - expected)
        raise GGUFImportError(
            f"{meta.src}: tensors do not match a {layers}-layer {meta.arch} model "
            f"(missing: {missing[:5]}; unexpected: {unexpected[:5]})"
        )
    for name, t in tensors.items():
        if t.tensor_type not in QUANT_TYPES:
            raise GGUFImportError(
                f"{meta.src}: tensor {name} has type {t.tensor_type.name}, which is not supported "
                f"(supported: {', '.join(q.name for q in QUANT_TYPES)})"
            )


def _weights(
    meta: GGUFMeta,
    tensors: dict[str, ReaderTensor],
    cfg: dict[str, Any],
    dtype: torch.dtype,
    quantization: str,
) -> dict[str, torch.Tensor]:
    heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}
    out: dict[str, torch.Tensor] = {}
    verb = "dequantising" if quantization == "none" else f"requantising ({quantization})"
    progress = tqdm(tensors.items(), desc=f"{verb} {meta.src.name}", unit=" tensors",
                    mininterval=2)  # fmt: skip
    for name, t in progress:
        hf = _hf_name(name)
        assert hf is not None  # _check_tensors admitted only mapped names
        kind = name.split(".")[-2]
        rows = heads[kind] if meta.arch == "llama" and kind in heads else 0
        layer = hf.removesuffix(".weight")
        if quantization != "none" and hf.endswith(".weight") and quantised_name(layer):
            qt = gguf_quant(layer, t, quantization)
            if rows:
                qt = qt.rows(torch.from_numpy(_unpermute(np.arange(qt.shape[0]), rows)))
            out |= qt.tensors(layer)
            continue
        w = dequantize(t.data, t.tensor_type)  # float32, shape (out, in): HF's layout
        if rows:
            w = _unpermute(w, rows)
        out[hf] = torch.tensor(w, dtype=torch.float32).to(dtype)
    return out


def _write(meta: GGUFMeta, out_dir: Path, dtype: str, quantization: str) -> None:
    if meta.arch not in ARCHITECTURES:
        raise GGUFImportError(
            f"{meta.src}: architecture {meta.arch!r} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    # Everything that can be refused is checked before the costly dequantisation.
    tensors = {t.name: t for t in meta.reader.tensors}
    _check_tensors(meta, tensors)
    vocab_size = int(tensors["token_embd.weight"].shape[-1])  # GGUF lists dims innermost first
    cfg = _config(meta, vocab_size, "output.weight" not in tensors, dtype)
    if quantization != "none":
        cfg |= marker(quantization)
    save_tokenizer(meta, out_dir, cfg["max_position_embeddings"])
    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    gen = {k: cfg[k] for k in ids if cfg[k] is not None}
    for name, data in (("config.json", cfg), ("generation_config.json", gen)):
        (out_dir / name).write_text(json.dumps(data, indent=2) + "\n")
    weights = _weights(meta, tensors, cfg, getattr(torch, dtype), quantization)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def import_gguf(
    src: Path,
    out_dir: Path,
    dtype: str = "float32",
    *,
    force: bool = False,
    quantization: str = "none",
) -> Path:
    """Write the checkpoint of GGUF file `src` to `out_dir` (atomically); return out_dir.

    quantization int8 / int4: the matrices stay quantised (`trd/models/gguf_quant.py`),
    the other tensors (norms, biases) are stored in dtype.

    A non-empty out_dir is replaced only with force=True; until the final rename the
    result is built in a temp folder next to it, so out_dir is never half-written.
    """
    src, out_dir = Path(src), Path(out_dir)
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported (choose from {DTYPES})")
    if quantization not in MODES:
        raise ValueError(f"quantization {quantization!r} is not supported (choose from {MODES})")
    if out_dir.exists() and not out_dir.is_dir():
        raise GGUFImportError(f"{out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise GGUFImportError(f"{out_dir}: not empty (use --force to replace it)")
    meta = GGUFMeta(src)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.import-", dir=out_dir.parent))
    try:
        _write(meta, tmp, dtype, quantization)
        readable_by_all(tmp)
        if out_dir.is_dir() and any(out_dir.iterdir()):
            old = tmp.with_name(tmp.name + "-old")
            os.rename(out_dir, old)
            os.rename(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.rename(tmp, out_dir)  # replaces an empty directory in one step
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def main(argv: list[str]) -> int:
    """`tokenrouterd import-gguf FILE OUT_DIR [--dtype D] [--force]`."""
    p = argparse.ArgumentParser(
        prog="tokenrouterd import-gguf",
        description="Turn a llama.cpp GGUF file (llama, qwen2 or qwen3 architecture) into an "
        "HF checkpoint directory that tokenrouterd serves: config.json, generation_config.json, "
        "model.safetensors (dequantised), tokenizer.json, tokenizer_config.json.",
        epilog="Quantisations: " + ", ".join(q.name for q in QUANT_TYPES) + ". Example: "
        "tokenrouterd import-gguf SmolLM2-135M-Instruct.Q4_1.gguf models/smollm2 --dtype bfloat16",
    )
    p.add_argument("file", type=Path, metavar="FILE", help="the .gguf file")
    p.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="checkpoint directory to write")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="weight dtype on disk")
    p.add_argument("--force", action="store_true", help="replace OUT_DIR if it is not empty")
    p.add_argument("--quantization", choices=MODES, default="none",
                   help="keep the matrices quantised: int4 (4 bits where the file's blocks have "
                   "at most 5, else 8) or int8; none dequantises them to --dtype")  # fmt: skip
    args = p.parse_args(argv)
    try:
        out = import_gguf(args.file, args.out_dir, args.dtype, force=args.force,
                          quantization=args.quantization)  # fmt: skip
    except GGUFImportError as exc:
        print(f"tokenrouterd import-gguf: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
