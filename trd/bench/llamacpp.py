"""llama.cpp's server as a baseline system: built once from pinned sources, serving the
demo's own GGUF files. A benchmark dependency only, never the product's.

    tokenrouterd bench llamacpp build           build llama-server and llama-bench (once)
    tokenrouterd bench llamacpp serve --model large [--draft small] [--parallel 16]

The sources are the llama.cpp that `llama-cpp-python==0.3.36` vendors (its sdist, from
pip: `pip download --no-binary :all: --no-deps`), built with CMake and Ninja
(-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON, Release; 15-25 minutes on 2
cores) into

    ~/.cache/tokenrouterd/llama-cpp/0.3.36/src/     the vendored llama.cpp tree
    ~/.cache/tokenrouterd/llama-cpp/0.3.36/build/   build/bin: llama-server, llama-bench,
                                                    their shared libraries

($TRD_LLAMA_CPP_DIR instead, if set: a toolchain cache, apart from the models' cache) and
reused as long as both binaries are there. A missing cmake or compiler stops the build
at once, naming what to install.

The systems serve the demo pair's Q4_K_M GGUF files (`trd.demo.qwen.ensure_gguf`: the
pinned parts joined and checked, kept in the cache): the 1.5B alone, the 0.5B alone, the
1.5B with the 0.5B as draft model (`-md`, speculative decoding), with `--parallel N`
slots, threads = the machine's cores, port 0 (the server logs the port it bound).
Decoding is greedy because every request says temperature 0.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trd.bench.server import Server, launch

VERSION = "0.3.36"  # llama-cpp-python's, whose sdist vendors the llama.cpp we build
TARGETS = ("llama-server", "llama-bench")
CMAKE_FLAGS = ("-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_SERVER=ON",
               "-DCMAKE_BUILD_TYPE=Release")  # fmt: skip
READY_LINE = re.compile(r"listening on https?://(\S+:\d+)")
# A CPU may list AMX (cpuinfo: amx_tile) that its hypervisor leaves off: -march=native then
# builds ggml's AMX kernels, which die of SIGILL at the first batched matmul (a prompt).
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
AMX_PROBE = r"""
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
  unsigned char cfg[64];
  if (syscall(SYS_arch_prctl, 0x1023, 18)) return 2; /* ARCH_REQ_XCOMP_PERM, XTILEDATA */
  memset(cfg, 0, sizeof cfg);
  cfg[0] = 1, cfg[16] = 64, cfg[48] = 16; /* palette 1, tile 0: 16 rows of 64 bytes */
  _tile_loadconfig(cfg);
  _tile_zero(0);
  _tile_release();
  return 0;
}
"""


class LlamaCppError(RuntimeError):
    """llama.cpp cannot be built or found; the message says what to do."""


def root() -> Path:
    default = Path.home() / ".cache" / "tokenrouterd" / "llama-cpp" / VERSION
    return Path(os.environ.get("TRD_LLAMA_CPP_DIR") or default).expanduser().absolute()


def binary(name: str, base: Path | None = None) -> Path:
    return (base or root()) / "build" / "bin" / name


def built(base: Path | None = None) -> bool:
    return all(binary(t, base).is_file() for t in TARGETS)


def missing_tools() -> list[str]:
    """What the build needs and this machine lacks."""
    need = {"cmake": ["cmake"], "ninja": ["ninja"], "a C++ compiler": ["c++", "g++", "clang++"]}
    return [what for what, names in need.items() if not any(shutil.which(n) for n in names)]


def build(base: Path | None = None) -> Path:
    """Build llama-server and llama-bench once (their folder, build/bin); reuse a build."""
    base = base or root()
    if built(base):
        return binary(TARGETS[0], base).parent
    if lacking := missing_tools():
        raise LlamaCppError(
            f"building llama.cpp's server needs {', '.join(lacking)}, not found on PATH; on "
            "Debian or Ubuntu: apt-get install cmake ninja-build g++"
        )
    base.mkdir(parents=True, exist_ok=True)
    if not (base / "src" / "CMakeLists.txt").is_file():
        fetch_sources(base)
    print(f"llama.cpp: building {', '.join(TARGETS)} in {base / 'build'} (15-25 minutes on "
          "2 cores); the compiler's progress follows", file=sys.stderr, flush=True)  # fmt: skip
    flags = list(CMAKE_FLAGS)
    if amx_faults(base):
        print("llama.cpp: this CPU lists AMX but cannot run it: building without",
              file=sys.stderr)  # fmt: skip
        flags += [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]
    run(["cmake", "-S", str(base / "src"), "-B", str(base / "build"), "-G", "Ninja", *flags],
        base / "cmake.log")  # fmt: skip
    run(["cmake", "--build", str(base / "build"), "--target", *TARGETS], base / "build.log")
    if not built(base):
        raise LlamaCppError(f"the build ended without {', '.join(TARGETS)}: see {base}/build.log")
    return binary(TARGETS[0], base).parent


def amx_faults(base: Path, cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU lists AMX tiles but a program using them dies (a hypervisor that
    leaves them off); False where the compiler or the CPU has no AMX to try."""
    if not cpuinfo.is_file() or "amx_tile" not in cpuinfo.read_text(errors="replace"):
        return False
    cc = shutil.which("cc") or shutil.which("gcc")
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        src, exe = Path(tmp) / "amx.c", Path(tmp) / "amx"
        src.write_text(AMX_PROBE)
        if not cc or subprocess.run([cc, "-O2", "-mamx-tile", str(src), "-o", str(exe)],
                                    capture_output=True).returncode:  # fmt: skip
            return False
        return subprocess.run([str(exe)], capture_output=True).returncode != 0


def fetch_sources(base: Path) -> None:
    """The sdist's vendored llama.cpp tree into base/src (whole, by rename)."""
    with tempfile.TemporaryDirectory(prefix=".src-", dir=base) as tmp:
        print(f"llama.cpp: downloading llama-cpp-python=={VERSION}'s sources", file=sys.stderr)
        run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
             f"llama-cpp-python=={VERSION}", "-d", tmp],
            base / "download.log")  # fmt: skip
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"), None)
        if sdist is None:
            raise LlamaCppError(f"pip left no llama_cpp_python sdist: see {base}/download.log")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        vendored = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        vendored.rename(base / "src")


def run(argv: list[str], log: Path) -> None:
    """`argv`, its output shown on stderr and kept in `log`; LlamaCppError if it fails."""
    with log.open("w") as out, subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            sys.stderr.write(line)
    if proc.returncode != 0:
        raise LlamaCppError(f"{' '.join(argv[:3])} ... failed ({proc.returncode}): see {log}")


@dataclass(frozen=True, slots=True)
class LlamaSystem:
    """One llama-server configuration: the model, an optional draft model, its slots."""

    model: str  # "small" or "large" (the demo pair's roles)
    draft: str | None = None
    parallel: int = 1
    threads: int = os.cpu_count() or 1
    context: int = 2048  # tokens per slot
    port: int = 0  # 0: a free port, reported in its log ("listening on ...")

    @property
    def name(self) -> str:
        draft = f"+draft_{self.draft}" if self.draft else ""
        return f"llama_server_{self.model}{draft}"

    def argv(self, ggufs: dict[str, Path], base: Path | None = None) -> list[str]:
        argv = [str(binary("llama-server", base)), "-m", str(ggufs[self.model]),
                "--alias", self.model, "--host", "127.0.0.1", "--port", str(self.port),
                "--parallel", str(self.parallel), "--ctx-size", str(self.context * self.parallel),
                "--threads", str(self.threads), "--threads-batch", str(self.threads)]  # fmt: skip
        if self.draft:
            argv += ["-md", str(ggufs[self.draft]), "--threads-draft", str(self.threads)]
        return [*argv, "--no-webui"]

    def config(self, ggufs: dict[str, Path]) -> dict[str, Any]:
        """What the result records of this system."""
        return {"kind": "llama-server", "llama_cpp_python": VERSION,
                "model": str(ggufs[self.model]),
                "draft": str(ggufs[self.draft]) if self.draft else None,
                "parallel": self.parallel, "threads": self.threads,
                "ctx_per_slot": self.context}  # fmt: skip


def demo_ggufs(system: LlamaSystem, cache_dir: Path | None = None) -> dict[str, Path]:
    from trd.demo.qwen import ensure_gguf

    return {role: ensure_gguf(role, cache_dir) for role in {system.model, system.draft} if role}


def start(system: LlamaSystem, folder: Path, cache_dir: Path | None = None) -> Server:
    """llama-server of `system` on the demo GGUFs, not yet waited for (`up()`: loaded)."""
    if not built():
        raise LlamaCppError(f"no llama-server in {root() / 'build' / 'bin'}: build it first "
                            "(tokenrouterd bench llamacpp build, 15-25 minutes)")  # fmt: skip
    lib = str(binary("llama-server").parent)
    env = {"LD_LIBRARY_PATH": os.pathsep.join(p for p in (lib, os.environ.get("LD_LIBRARY_PATH"))
                                              if p)}  # fmt: skip
    server = launch(system.name, system.argv(demo_ggufs(system, cache_dir)), folder, env,
                    ready_file=False)  # fmt: skip
    server.ready_line = READY_LINE
    return server


def main(argv: list[str]) -> int:
    """`tokenrouterd bench llamacpp build|serve`."""
    import argparse

    p = argparse.ArgumentParser(prog="tokenrouterd bench llamacpp",
                                description=__doc__.split("\n\n")[0])  # fmt: skip
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("build", help="build llama-server and llama-bench once (15-25 minutes)")
    serve = sub.add_parser("serve", help="serve a demo GGUF until Ctrl-C (port: in the log)")
    serve.add_argument("--model", choices=("small", "large"), default="large")
    serve.add_argument("--draft", choices=("small",), help="speculative decoding's draft model")
    serve.add_argument("--parallel", type=int, default=1, help="slots (requests at once)")
    serve.add_argument("--port", type=int, default=0, help="default 0: any free port")
    serve.add_argument("--folder", type=Path, default=Path("."), help="for its log")
    args = p.parse_args(argv)
    try:
        if args.what == "build":
            print(f"llama.cpp: {build()}")
            return 0
        system = LlamaSystem(args.model, args.draft, args.parallel, port=args.port)
        server = start(system, args.folder).up(600)
    except LlamaCppError as exc:
        print(f"tokenrouterd bench llamacpp: {exc}", file=sys.stderr)
        return 1
    print(f"{system.name} serving at {server.url} (log: {server.log_path}); Ctrl-C stops it",
          flush=True)  # fmt: skip
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
