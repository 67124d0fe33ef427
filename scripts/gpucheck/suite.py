"""The suite's CUDA tests, on the device: they skip without a CUDA device, so CI never
runs them, and only this stage does.

    python -m gpucheck.suite OUT.json

Runs pytest on CUDA_TESTS from the checkout, with the fixture models that travel in
.gpu/cache, and reports the counts from its JUnit XML. The dry run walks this stage's code
in CI with test_flashinfer.py alone, whose tests all skip without CUDA: the other files
run in the suite itself, and one of them asks for the fixture models, whose build a niced
background run must not take over from the suite (tests/background.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from gpucheck.common import DRY_RUN, REPO, WORK, dump, log

# Every test file that takes the CUDA path: real kernels and graphs (test_flashinfer),
# backend choice, the torch backend, the step timer, plan ordering, workspace, config,
# the policies' one read-back per routing step (test_routing_device: the device's own).
CUDA_TESTS = ["tests/test_flashinfer.py", "tests/test_attention_backends.py",
              "tests/test_torch_attention.py", "tests/test_model_timer.py",
              "tests/test_flashinfer_plan_order.py", "tests/test_flashinfer_workspace.py",
              "tests/test_gpu_config.py", "tests/test_routing_device.py"]  # fmt: skip


def fixtures_into_the_checkout() -> None:
    """tests/conftest.py reads the fixture models from REPO/.cache; on the device they
    came in .gpu/cache (TRD_CACHE_DIR), and building them there would take minutes."""
    carried = Path(os.environ.get("TRD_CACHE_DIR", REPO / ".cache"))
    if carried.is_dir() and carried.resolve() != (REPO / ".cache").resolve():
        shutil.copytree(carried, REPO / ".cache", dirs_exist_ok=True)


def main() -> None:
    fixtures_into_the_checkout()
    junit = WORK / "suite.xml"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs",
            f"--junitxml={junit}", *(CUDA_TESTS[:1] if DRY_RUN else CUDA_TESTS)]  # fmt: skip
    code = subprocess.call(argv, cwd=REPO)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if junit.exists():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite[0]
        counts = {k: int(suite.get(k, 0)) for k in counts}
    failed = counts["failures"] + counts["errors"]
    result = {"ok": code == 0 and failed == 0, "pytest_exit": code, **counts,
              "passed": counts["tests"] - failed - counts["skipped"]}  # fmt: skip
    log(f"suite: {result}")
    dump(sys.argv[1], result)


if __name__ == "__main__":
    main()
