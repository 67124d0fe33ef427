"""The GGUF importer on small GGUF files written here, and its tokenizer on the real file.

Small files come from tiny random HF checkpoints, written out the way llama.cpp's
converter lays them out (names, and the per-head Q/K row permutation of llama-arch
models), so the import must give back exactly the tensors we started from.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gguf
import gguf.quants
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from trd.daemon import main as daemon_main
from trd.models.checkpoint import read_checkpoint
from trd.models.gguf import import_gguf
from trd.models.gguf_meta import GGUFImportError, GGUFMeta
from trd.models.gguf_tokenizer import build_tokenizer
from trd.models.qformat import QuantTensor
from trd.testing.smollm2 import packaged_gguf
from trd.testing.tinymodels.build import save_random_checkpoint

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b  # sum\n",
    "In 2024, 3.14159 * 1000 = 3141.59; call 555-0199.",
    "tabs\tand   spaces \n\n\n   end  ",
    "Voilà un café très élégant à Paris.",
    "Größe, Straße und schöne Äpfel.",
    "北京欢迎你，今天天气很好。",
    "Emoji: 🙂🚀👍🏽 done",
    "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
]
# name fragments of the HF layout -> llama.cpp's, applied in order
_TO_GGUF = [
    ("model.embed_tokens.", "token_embd."), ("model.norm.", "output_norm."),
    ("lm_head.", "output."), ("model.layers.", "blk."), ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"), ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"), ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down"),
    ("post_attention_layernorm", "ffn_norm"), ("input_layernorm", "attn_norm"),
]  # fmt: skip


def gguf_name(hf_name: str) -> str:
    for old, new in _TO_GGUF:
        hf_name = hf_name.replace(old, new)
    return hf_name


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Each head's rows [a0..a(d/2-1) | b0..] -> [a0 b0 a1 b1 ..], as llama.cpp stores them."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(
    ckpt: Path,
    path: Path,
    arch: str,
    drop: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
    raw: dict[str, gguf.GGMLQuantizationType] | None = None,
    quant: gguf.GGMLQuantizationType | None = None,
) -> None:
    """ckpt as a GGUF file; `drop` omits metadata keys, `extra` adds tensors of that name,
    `raw` writes the named tensors as zero bytes of another type, `quant` stores every
    matrix in that block type (gguf's own quantiser)."""
    cfg = json.loads((ckpt / "config.json").read_text())
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    w = gguf.GGUFWriter(path, arch)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    meta = {
        f"{arch}.block_count": cfg["num_hidden_layers"],
        f"{arch}.context_length": cfg["max_position_embeddings"],
        f"{arch}.embedding_length": cfg["hidden_size"],
        f"{arch}.feed_forward_length": cfg["intermediate_size"],
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": kv_heads,
        f"{arch}.attention.key_length": cfg.get("head_dim") or cfg["hidden_size"] // heads,
    }
    for key, value in meta.items():
        if key not in drop:
            w.add_uint32(key, value)
    w.add_float32(f"{arch}.rope.freq_base", cfg["rope_parameters"]["rope_theta"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"])
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    specials = {t["content"] for t in tok["added_tokens"] if t["special"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if t in specials else 1 for t, _ in vocab])
    w.add_token_merges([" ".join(m) for m in tok["model"]["merges"]])
    w.add_eos_token_id(0)
    w.add_chat_template((ckpt / "chat_template.jinja").read_text())
    for name, t in load_file(ckpt / "model.safetensors").items():
        a = t.numpy()
        if arch == "llama" and ".q_proj." in name:
            a = llama_cpp_permute(a, heads)
        if arch == "llama" and ".k_proj." in name:
            a = llama_cpp_permute(a, kv_heads)
        qtype = (raw or {}).get(gguf_name(name))
        if qtype is not None:
            a = np.zeros(gguf.quant_shape_to_byte_shape(a.shape, qtype), dtype=np.uint8)
        elif quant is not None and a.ndim == 2:
            a, qtype = gguf.quants.quantize(a, quant), quant
        w.add_tensor(gguf_name(name), a, raw_dtype=qtype)
    for name in extra:
        w.add_tensor(name, np.ones(8, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=[("llama", True), ("qwen2", False), ("qwen3", True)])
def random_ckpt(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    arch, tied = request.param
    out = save_random_checkpoint(
        arch, tmp_path_factory.mktemp(arch), seed=3, tie_word_embeddings=tied
    )
    # Norm weights start at one and biases at zero: make them distinct so a swapped name shows.
    weights = load_file(out / "model.safetensors")
    torch.manual_seed(1)
    save_file({k: v + torch.randn_like(v) if v.dim() == 1 else v for k, v in weights.items()},
              out / "model.safetensors")  # fmt: skip
    return out


def test_import_gives_back_the_checkpoint_it_was_written_from(
    random_ckpt: Path, tmp_path: Path
) -> None:
    arch = read_checkpoint(random_ckpt).config.model_type
    write_gguf(random_ckpt, tmp_path / "m.gguf", arch)
    out = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    expected = load_file(random_ckpt / "model.safetensors")
    got = load_file(out / "model.safetensors")
    if read_checkpoint(random_ckpt).config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    assert sorted(got) == sorted(expected)
    for name, t in expected.items():
        assert torch.equal(got[name], t), name
    want = dataclasses.replace(read_checkpoint(random_ckpt).config, eos_token_ids=(0,))
    assert read_checkpoint(out).config == want
    ours, theirs = (Tokenizer.from_file(str(d / "tokenizer.json")) for d in (out, random_ckpt))
    for text in TEXTS:
        assert ours.encode(text).ids == theirs.encode(text).ids, text


@pytest.mark.parametrize(
    "block,mode,bits",
    [(T.Q8_0, "int8", 8), (T.Q8_0, "int4", 8), (T.Q4_0, "int4", 4), (T.Q5_0, "int8", 8)],
)
def test_a_quantised_import_keeps_each_matrix_in_its_bits(
    random_ckpt: Path, tmp_path: Path, block: T, mode: str, bits: int
) -> None:
    """Against the dequantised import of the same file: Q8_0 stays exact in 8 bits, other
    blocks round within half a step of ours; llama's q/k rows come back in HF's order."""
    arch = read_checkpoint(random_ckpt).config.model_type
    write_gguf(random_ckpt, tmp_path / "m.gguf", arch, quant=block)
    floats = load_file(import_gguf(tmp_path / "m.gguf", tmp_path / "f") / "model.safetensors")
    out = import_gguf(tmp_path / "m.gguf", tmp_path / "q", quantization=mode)
    ckpt = read_checkpoint(out)
    assert ckpt.quantization == mode
    assert ckpt.config == read_checkpoint(tmp_path / "f").config
    stored = load_file(out / "model.safetensors")
    matrices = [n for n, t in floats.items() if t.dim() == 2]
    assert matrices and not set(matrices) & set(stored)
    for name in matrices:
        qt = QuantTensor.from_tensors(name.removesuffix(".weight"), stored)
        assert qt.bits == bits, name
        error = (qt.dequantize() - floats[name]).abs()
        step = qt.scales.float().repeat_interleave(32, dim=1)
        if block == T.Q8_0:
            assert error.max() == 0, name
        assert (error <= 0.5 * step + 1e-3 * step).all(), name
    for name, t in floats.items():
        if t.dim() == 1:
            assert torch.equal(stored[name], t), name


@pytest.fixture
def llama_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_checkpoint(
        "llama", tmp_path_factory.mktemp("l"), 3, tie_word_embeddings=True
    )


def test_cli_writes_atomically_and_refuses_to_overwrite(
    llama_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tokenrouterd import-gguf`, called as the command line calls it (in this process:
    a subprocess per call cost 5 s of imports)."""
    src, out = tmp_path / "m.gguf", tmp_path / "out"
    write_gguf(llama_ckpt, src, "llama")

    def run(*args: str) -> tuple[int, str]:
        try:
            code = daemon_main(["import-gguf", *args])
        except SystemExit as exc:
            code = int(exc.code or 0)
        return code, capsys.readouterr().err

    code, err = run(str(src), str(out), "--dtype", "bfloat16")
    assert code == 0, err
    assert load_file(out / "model.safetensors")["model.norm.weight"].dtype == torch.bfloat16
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    code, err = run(str(src), str(out))
    assert code == 2 and "not empty (use --force" in err
    code, err = run(str(src), str(out), "--force")
    assert code == 0, err
    assert load_file(out / "model.safetensors")["model.norm.weight"].dtype == torch.float32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "out"]  # no temp left


def test_errors_name_the_file_and_what_is_wrong(llama_ckpt: Path, tmp_path: Path) -> None:
    def fails(src: Path, *match: str) -> None:
        with pytest.raises(GGUFImportError) as err:
            import_gguf(src, tmp_path / "out")
        assert all(m in str(err.value) for m in (str(src), *match)), str(err.value)
        assert not [p for p in tmp_path.iterdir() if p.name.startswith((".out", "out"))]

    (tmp_path / "notes.gguf").write_text("not a gguf file at all")
    fails(tmp_path / "notes.gguf", "not a readable GGUF file")
    (tmp_path / "empty.gguf").write_bytes(b"")
    fails(tmp_path / "empty.gguf", "not a readable GGUF file")
    fails(tmp_path / "absent.gguf", "no such file")
    write_gguf(llama_ckpt, tmp_path / "phi.gguf", "phi3")
    fails(tmp_path / "phi.gguf", "architecture 'phi3' is not supported")
    write_gguf(llama_ckpt, tmp_path / "noff.gguf", "llama", drop=("llama.feed_forward_length",))
    fails(tmp_path / "noff.gguf", "missing metadata key 'llama.feed_forward_length'", "llama")
    write_gguf(llama_ckpt, tmp_path / "freqs.gguf", "llama", extra=("rope_freqs.weight",))
    fails(tmp_path / "freqs.gguf", "unexpected: ['rope_freqs.weight']")
    iq4 = {"blk.1.ffn_up.weight": gguf.GGMLQuantizationType.IQ4_NL}
    write_gguf(llama_ckpt, tmp_path / "iq4.gguf", "llama", raw=iq4)
    fails(tmp_path / "iq4.gguf", "blk.1.ffn_up.weight has type IQ4_NL, which is not supported")


@pytest.fixture(scope="module")
def smollm_tokenizer() -> Tokenizer:
    return build_tokenizer(GGUFMeta(packaged_gguf()))[0]


def test_tokenizer_encodes_like_transformers_gguf_conversion(smollm_tokenizer: Tokenizer) -> None:
    src = packaged_gguf()
    try:
        ref = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    except (ImportError, ValueError, OSError) as exc:  # no gguf/accelerate, or format changes
        pytest.skip(f"transformers cannot convert GGUF tokenizers here: {exc}")
    for text in TEXTS:
        ours = smollm_tokenizer.encode(text).ids
        assert ours == ref.encode(text, add_special_tokens=False), text
        assert smollm_tokenizer.decode(ours, skip_special_tokens=False) == text
