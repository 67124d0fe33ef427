"""Versions and the device (trd/bench/gpu/versions.py): what this run checked.

python -m gpucheck.versions OUT.json
"""

from __future__ import annotations

import sys

from gpucheck.common import DRY_RUN, dump
from gpucheck.mps import CARRIED
from trd.bench.gpu.versions import versions


def main() -> None:
    info = {**versions([CARRIED]), "dry_run": DRY_RUN}
    ok = DRY_RUN or (info["cuda_available"] and not str(info["flashinfer"]).startswith("not"))
    dump(sys.argv[1], {"ok": ok, **info})


if __name__ == "__main__":
    main()
