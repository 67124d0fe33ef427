#!/bin/sh
# Fill .gpu/ (ignored by git) with what scripts/gpu_check.sh needs on a device machine
# without network; run it here, in the checkout the device call sends, then carry .gpu:
#   .gpu/whl    wheels for its CPython 3.12 (pip download, nothing installed here)
#   .gpu/cache  the fixture models and tokenizer (the shaped checkpoints use the tokenizer)
#   .gpu/mps    Debian's nvidia-cuda-mps, unpacked (used where the machine has none)
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
dest="$repo/.gpu"
python=${PYTHON:-python3}
mkdir -p "$dest/whl" "$dest/cache"
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64 -d "$dest/whl" \
    flashinfer-python==0.6.18.post1 apache-tvm-ffi==0.1.15.post2 \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    llguidance==1.9.1
root=$(PYTHONPATH="$repo" "$python" -c \
    'from trd.testing.tinymodels.build import ensure_models; from trd.testing.tinymodels.cache import cache_root
ensure_models(); print(cache_root())')
rm -rf "$dest/cache/$(basename "$root")"
cp -r "$root" "$dest/cache/"
rm -f "$dest/cache/$(basename "$root")/.lock"
if "$repo/scripts/fetch_mps.sh" "$dest/mps-fetch" >/dev/null; then
    rm -rf "$dest/mps" && mv "$dest/mps-fetch" "$dest/mps" && rm -rf "$dest/mps/apt"
else
    echo "gpu_check_prepare: no MPS package fetched; the check uses the machine's binary" >&2
fi
du -sh "$dest"
# One device call carries at most 64 MiB.
if [ "$(du -sm "$dest" | cut -f1)" -gt 64 ]; then
    echo "gpu_check_prepare: $dest is over 64 MiB: it cannot travel" >&2
    exit 1
fi
