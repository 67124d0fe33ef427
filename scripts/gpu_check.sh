#!/usr/bin/env bash
# Every GPU check of tokenrouterd in one command, for one H200 (under 8 minutes):
#
#   versions      torch, CUDA, nvcc, flashinfer, driver, compute capability
#   attention     flashinfer vs the torch backend on a float32 copy: decode, prefill from
#                 empty, extend on existing KV, mixed, full last pages; heads (16,8,128),
#                 (40,8,128), (28,4,128), (2,1,32); every max error printed
#   checkpoints   Qwen3-0.6B/8B-shaped random checkpoints (made on the GPU, in parallel)
#   engines       float32 on CUDA refused; graphs on vs off give equal greedy tokens on
#                 the fixtures and the shaped pair (scripted handoffs at every kind of
#                 position), the shaped pair's as its weights make them; step ms per batch
#                 size per model; graph pool and CUDA context against the memory plan
#   mps           the daemon under `mps: required`: both engines MPS clients per NVML or
#                 nvidia-smi, one completion served, MPS gone after the stop
#   throughput    N = 1, 4, 16 on the shaped pair, 25% of tokens by the 8B, graphs on vs
#                 off, the official-style loop as the reference (tokens must match)
#   pytest_gpu    tests/test_flashinfer.py
#
# Usage: scripts/gpu_check.sh OUT_DIR   -> OUT_DIR/gpu_check.json, summary.txt, log.txt
# Exit: 0 all passed, 1 something failed or did not run, 3 no CUDA device (nothing ran).
# Needs no network. Without a GPU it stops at "no CUDA device" (exit 3).
#
# On the device machine (tools `run` of the device README; it has torch, nvcc, ninja,
# transformers, pytest, but no flashinfer or pydantic and no network):
#   1. Here, once, in the checkout that will be sent (the main one):
#        scripts/gpu_check_prepare.sh
#      It fills .gpu/ (ignored by git, ~30 MB): .gpu/whl (flashinfer-python 0.6.18.post1,
#      pure Python, it compiles its kernels with the machine's nvcc on first use;
#      apache-tvm-ffi for CPython 3.12; pydantic, pydantic-core, annotated-types,
#      typing-inspection), .gpu/cache (the fixture models) and .gpu/mps (Debian's
#      nvidia-cuda-mps, used only if the machine has no nvidia-cuda-mps-control).
#   2. The device call:
#        run(command="bash scripts/gpu_check.sh $OUT", carry=[".gpu"], timeout_s=600)
#      The summary comes back as $OUT/summary.txt.
set -u

out=${1:?usage: scripts/gpu_check.sh OUT_DIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 1
mkdir -p "$out"
python=${PYTHON:-python3}

site=/tmp/gpu_check_site
if [ -d .gpu/whl ] && ! "$python" -c "import flashinfer" 2>/dev/null; then
    echo "installing the carried wheels into $site"
    if "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .gpu/whl/*.whl; then
        export PYTHONPATH="$site"
    else  # e.g. another Python than the 3.12 they were fetched for: the checks say so
        echo "gpu_check: the carried wheels do not install here; flashinfer may be missing"
    fi
fi
export PYTHONPATH="$repo:$repo/scripts${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export GPU_CHECK_WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
# The fixtures travel in .gpu/cache; elsewhere they come from (or are built into) the cache.
if [ -d .gpu/cache ]; then export TRD_CACHE_DIR="$repo/.gpu/cache"; fi
export GPU_CHECK_FIXTURES=${GPU_CHECK_FIXTURES:-$("$python" -c \
    'from trd.testing.tinymodels.cache import cache_root; print(cache_root())')}
# flashinfer's kernel cache (compiled on first use; minutes, once per machine).
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/gpu_check_flashinfer}
exec "$python" -m gpucheck.main "$out"
