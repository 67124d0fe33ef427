"""llama.cpp's server as a baseline (`trd/bench/llamacpp.py`): what it is started with, what
a machine without the build tools is told, and, where the build exists (never built here:
15-25 minutes), `bench serve` against it with the columns our daemon's run has, the
token-model ones empty."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trd.bench import llamacpp
from trd.bench.llamacpp import LlamaCppError, LlamaSystem
from trd.bench.serve import main as bench_serve
from trd.demo.parts import missing
from trd.demo.qwen import SMALL


def test_a_machine_without_cmake_is_told_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRD_LLAMA_CPP_DIR", str(tmp_path / "llama"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no cmake, ninja or compiler here
    with pytest.raises(LlamaCppError, match=r"needs cmake, ninja, a C\+\+ compiler, not found"):
        llamacpp.build()
    assert not (tmp_path / "llama").exists()  # nothing downloaded, nothing half-built
    with pytest.raises(LlamaCppError, match=r"no llama-server in .*: build it first"):
        llamacpp.start(LlamaSystem("small"), tmp_path)


def test_amx_that_the_cpu_lists_but_cannot_run_is_left_out_of_the_build(tmp_path: Path) -> None:
    """A hypervisor may list AMX and leave it off (a tile instruction then dies of SIGILL):
    the probe says so and the build turns AMX off; a CPU that lists none is not probed."""
    listed, unlisted = tmp_path / "amx", tmp_path / "plain"
    listed.write_text("flags\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n")
    unlisted.write_text("flags\t: fpu avx2 avx512f\n")
    assert llamacpp.amx_faults(tmp_path, unlisted) is False
    real = Path("/proc/cpuinfo")
    faults = llamacpp.amx_faults(tmp_path, listed)  # the probe runs on this CPU
    if not real.is_file() or "amx_tile" not in real.read_text():  # it has no AMX at all
        assert faults is True
    assert set(tmp_path.iterdir()) == {listed, unlisted}  # the probe's program went with it


def test_the_draft_system_serves_the_large_model_with_the_small_as_draft() -> None:
    ggufs = {"small": Path("/g/small.gguf"), "large": Path("/g/large.gguf")}
    argv = LlamaSystem("large", "small", parallel=16).argv(ggufs, Path("/l"))
    flags = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert argv[0] == "/l/build/bin/llama-server" and flags["-m"] == "/g/large.gguf"
    assert flags["-md"] == "/g/small.gguf" and flags["--parallel"] == "16"
    assert flags["--port"] == "0" and flags["--threads"] == str(os.cpu_count())
    assert int(flags["--ctx-size"]) == 16 * LlamaSystem("large").context
    assert "-md" not in LlamaSystem("large").argv(ggufs, Path("/l"))
    assert LlamaSystem("large", "small").name == "llama_server_large+draft_small"


@pytest.mark.skipif(not llamacpp.built(), reason="llama.cpp's server is not built here")
@pytest.mark.skipif(bool(missing(SMALL)), reason="the demo extra's GGUF parts are missing")
def test_bench_serve_measures_llama_server_with_the_same_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = llamacpp.start(LlamaSystem("small", parallel=2, threads=1), tmp_path).up(600)
    try:
        out = tmp_path / "result.json"
        argv = ["--base-url", server.url, "--num-prompts", "2", "--max-tokens", "8",
                "--max-concurrency", "2", "--ignore-eos", "--out", str(out)]  # fmt: skip
        assert bench_serve(argv) == 0
    finally:
        assert server.stop() == 0, server.log()
    s = json.loads(out.read_text())["runs"][0]["summary"]
    assert (s["failed"], s["output_tokens"]) == (0, 16)  # ignore_eos: 8 tokens each
    assert s["ttft_ms"]["p50"] is not None and s["tpot_ms"]["p50"] is not None
    assert s["large_share"] is None and s["identity"] is None
    assert "Large-token share:" in capsys.readouterr().out
