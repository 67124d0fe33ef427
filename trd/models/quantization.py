"""Which weights a quantisation mode stores in how many bits, and what they cost. No torch.

    models[].quantization   none | int8 | int4
      int8   every linear, the output projection and the embedding table: 8 bits
      int4   the decoder layers' linears: 4 bits; the output projection and the
             embedding table: 8 bits (from a GGUF: 4 bits where its block was 4-bit
             already, 8 where it had more; `trd/models/gguf_quant.py`)

A quantised checkpoint says so in its config.json with our own key,

    "trd_quantization": {"format": 1, "mode": "int4", "group_size": 32}

not Hugging Face's `quantization_config` (which names a method transformers runs, GPTQ
or AWQ say, and which the checkpoint reader refuses): its tensors are our layout
(`trd/models/qformat.py`), which no other loader reads.
"""

from __future__ import annotations

from typing import Any

MODES = ("none", "int8", "int4")
FORMAT = 1
GROUP = 32
KEY = "trd_quantization"
EMBEDDING = "model.embed_tokens"
HEAD = "lm_head"
# Layer linears end with these (the HF names the model code mirrors).
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantised_name(name: str) -> bool:
    """Whether `<name>.weight` is a matrix a mode quantises."""
    return name in (EMBEDDING, HEAD) or name.rsplit(".", 1)[-1] in LINEARS


def bits_for(name: str, mode: str) -> int:
    """Bits of weight `name` (without ".weight") when a float checkpoint is quantised."""
    if mode == "int4" and name not in (EMBEDDING, HEAD):
        return 4
    return 8


def linear_kinds(
    matrices: tuple[tuple[str, int, int, int], ...], mode: str
) -> set[tuple[int, int]]:
    """(inputs, bits) of a checkpoint's matrices (`Checkpoint.matrices`) served in `mode`."""
    if mode == "none":
        return set()
    return {(cols, bits or bits_for(name, mode)) for name, _, cols, bits in matrices}


def quantised_bytes(rows: int, cols: int, bits: int) -> int:
    """q, a float16 scale per group of 32 and, for 4 bits, a float16 min per group."""
    groups = rows * (cols // GROUP)
    return rows * cols * bits // 8 + groups * 2 * (2 if bits == 4 else 1)


def marker(mode: str) -> dict[str, Any]:
    return {KEY: {"format": FORMAT, "mode": mode, "group_size": GROUP}}


def read_marker(cfg: dict[str, Any], source: str) -> str:
    """The mode a checkpoint's config.json declares ("none" without the key)."""
    raw = cfg.get(KEY)
    if raw is None:
        return "none"
    ok = (
        isinstance(raw, dict)
        and raw.get("format") == FORMAT
        and raw.get("mode") in MODES[1:]
        and raw.get("group_size") == GROUP
    )
    if not ok:
        raise ValueError(
            f"{source}: {KEY} {raw!r} is not one this version reads (expected format "
            f"{FORMAT}, mode int8 or int4, group_size {GROUP}): import the model again"
        )
    return str(raw["mode"])
