#!/usr/bin/env bash
# Every GPU check of tokenrouterd in one command: a complete verdict in about 6 minutes on
# a fresh H200, kernel compilation included (docs/gpu.md: what it proves, what it cannot).
#
#   versions     python, torch, CUDA, nvcc, ninja, flashinfer, driver, compute capability,
#                the MPS binary and the driver it belongs to: what ran
#   checkpoints  the shaped pair: Qwen3-0.6B and -8B shapes, and the demo pair's Qwen2.5
#                0.5B and 1.5B shapes, 2 layers each (seconds)
#   attention    flashinfer vs the torch backend on a float32 copy: decode, prefill,
#                extend on existing KV, mixed, full last pages; heads (16,8,128),
#                (32,8,128), (40,8,128), (28,4,128), (12,2,128), (14,2,64); head_dim 32
#                gets torch.
#                Compiles the two kernel modules used (head_dim 64, 128) at once; every
#                later stage reuses them (one FLASHINFER_WORKSPACE_BASE)
#   engines      one engine, graphs on vs off: token-exact, and the designed tokens (the
#                8B shape, then the demo pair's two Qwen2 shapes)
#   mps          the routed pair through the daemon under MPS, token-exact against the
#                tokens the shaped weights make; both engines MPS clients
#   memory       one engine's process: NVML (nvidia-smi) against the memory plan
#   throughput   the pair in engine processes, N = 1 and 16, graphs on and off
#   suite        the suite's CUDA test files (gpucheck/suite.py), which skip without CUDA
#
# Usage: scripts/gpu_check.sh [--dry-run | --bench] OUT_DIR
#   -> OUT_DIR/summary.txt (rewritten after every stage; first line PASS, FAIL: stages,
#      or INCOMPLETE), gpu_check.json, log.txt
# --dry-run walks every stage on the CPU (float32, tiny models, no MPS); CI runs it.
# --bench runs `tokenrouterd bench compare --plan gpu` instead, in the same setup (the
#   carried wheels, tokenizer, kernel cache): OUT_DIR/result.json, summary.txt, table.md,
#   log.txt, logs/ (docs/gpu.md, "The GPU benchmark"; at most 9 minutes).
# Exit: 0 all passed, 1 something failed or did not run, 3 no CUDA device (nothing ran).
#
# On the device machine (its own Python, torch, nvcc, ninja, psutil; no network):
#   1. Here, once: scripts/gpu_check_prepare.sh  (fills .gpu/, under 64 MiB: the wheels
#      `import flashinfer` and the daemon need there, the fixture tokenizer, an MPS package)
#   2. Copy the tree with .gpu/ to the GPU host; there: timeout 600 bash scripts/gpu_check.sh OUT
set -u

mode=check
case "${1:-}" in
    --dry-run) export GPU_CHECK_DRY_RUN=1; shift ;;
    --bench) mode=bench; shift ;;
esac
out=${1:?usage: scripts/gpu_check.sh [--dry-run | --bench] OUT_DIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo" || exit 1
mkdir -p "$out"
python=${PYTHON:-python3}

site=/tmp/gpu_check_site
if [ -z "${GPU_CHECK_DRY_RUN:-}" ] && [ -d .gpu/whl ] && ! "$python" -c "import flashinfer" 2>/dev/null; then
    echo "installing the carried wheels into $site"
    if "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .gpu/whl/*.whl; then
        export PYTHONPATH="$site"
    else  # e.g. another Python than the 3.12 they were fetched for: versions says so
        echo "gpu_check: the carried wheels do not install here; flashinfer may be missing"
    fi
fi
export PYTHONPATH="$repo:$repo/scripts${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# The fixture tokenizer (the shaped models use it) travels in .gpu/cache.
if [ -d .gpu/cache ]; then export TRD_CACHE_DIR="$repo/.gpu/cache"; fi
# The shaped checkpoints (a few GB) go to memory when there is room for them.
if [ -z "${GPU_CHECK_WORK:-}" ]; then
    GPU_CHECK_WORK=/tmp/gpu_check
    if [ -z "${GPU_CHECK_DRY_RUN:-}" ] && [ -w /dev/shm ]; then GPU_CHECK_WORK=/dev/shm/gpu_check; fi
    export GPU_CHECK_WORK
fi
# flashinfer's kernels: compiled once per machine, into one place every stage reads.
export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/gpu_check_flashinfer}
if [ "$mode" = bench ]; then  # the same setup, then the benchmark's own command
    exec "$python" -m trd.daemon bench compare --plan gpu --out "$out/result.json"
fi
exec "$python" -m gpucheck.main "$out"
