"""The routed pair through the daemon under managed MPS (`mps: required`), token-exact.

    python -m gpucheck.mps OUT.json

Finds nvidia-cuda-mps-control (PATH, the driver's folders, else the Debian package
scripts/gpu_check_prepare.sh carried in .gpu/mps: trd/mps/driver.py `find_control`; the
daemon refuses one of another driver branch, saying so), starts `tokenrouterd` with the
shaped pair (0.6B-shaped entry, 8B-shaped large) and the scripted schedule of
trd/testing/shaped.py, and sends the routed workload as completions with token-id
prompts, four at a time, through HTTP. Every answer's token ids must equal the ones the
shaped weights make under that schedule (shaped.py `expected_tokens`: computed, no model
runs for it). Then NVML (MPS client processes),
nvidia-smi (compute apps) and the control daemon (client list) say which processes use
the GPU: each engine (the daemon's children, found with psutil) must be among NVML's or
nvidia-smi's. Stops the daemon and checks that the MPS control daemon went with it.
The dry run serves the same on the CPU without MPS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from gpucheck.common import (
    DEVICE,
    DRY_RUN,
    DTYPE,
    REPO,
    dump,
    first_mismatch,
    log,
    model_path,
)
from trd.bench.server import Daemon, daemon_config, launch_daemon, write_config
from trd.mps.driver import find_control, path_with
from trd.protocol import SamplingParams
from trd.testing.shaped import SCHEDULE, expected_tokens, jobs

CARRIED = REPO / ".gpu/mps/root/usr/bin"  # scripts/gpu_check_prepare.sh's package


def config() -> dict[str, Any]:
    models = {name: model_path(name) for name in ("small", "large")}
    return daemon_config(
        models, {"name": "scripted", "schedule": SCHEDULE}, dtype=DTYPE, max_model_len=4096,
        device=DEVICE, mps="off" if DRY_RUN else "required", memory={"budget_gib": 24},
        shutdown={"grace_s": 1},
    )  # fmt: skip


def http(daemon: Daemon, path: str, body: dict[str, Any] | None = None, timeout: float = 5) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{daemon.url}{path}", data=data,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def engine_pids(pid: int) -> list[int]:
    """The daemon's engine processes: its multiprocessing children (not the resource
    tracker, which multiprocessing also starts)."""
    kids = psutil.Process(pid).children()
    return [k.pid for k in kids if any("spawn_main" in a for a in k.cmdline())]


def mps_clients(control: Path, env: dict[str, str]) -> dict[str, Any]:
    """Who uses the GPU, as NVML, nvidia-smi and the MPS control daemon each tell."""
    import pynvml

    seen: dict[str, Any] = {}
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        procs = pynvml.nvmlDeviceGetMPSComputeRunningProcesses(handle)
        seen["nvml_mps"] = sorted(p.pid for p in procs)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        seen["nvml_compute"] = sorted(p.pid for p in procs)
    except pynvml.NVMLError as exc:
        seen["nvml_error"] = str(exc)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name",
                              "--format=csv,noheader"], capture_output=True, text=True)  # fmt: skip
        seen["nvidia_smi"] = smi.stdout.strip().splitlines()
    except OSError as exc:
        seen["nvidia_smi"] = [f"unavailable: {exc}"]
    seen["nvidia_smi_pids"] = [int(x.split(",")[0]) for x in seen["nvidia_smi"] if x[:1].isdigit()]
    ask = {**os.environ, **env}
    servers = subprocess.run([str(control)], input="get_server_list\n", env=ask,
                             capture_output=True, text=True).stdout.split()  # fmt: skip
    seen["mps_servers"] = servers
    seen["mps_clients"] = [
        subprocess.run([str(control)], input=f"get_client_list {s}\n", env=ask,
                       capture_output=True, text=True).stdout.split()
        for s in servers
    ]  # fmt: skip
    return seen


def main() -> None:
    out_path = sys.argv[1]
    control = None if DRY_RUN else find_control([CARRIED])
    result: dict[str, Any] = {"control": str(control) if control else None}
    if control is None and not DRY_RUN:
        dump(out_path, {"ok": False, **result, "error": "no nvidia-cuda-mps-control binary"})
        return
    log(f"MPS control binary: {control}")
    work = Path(tempfile.mkdtemp(prefix="trdmps-", dir="/tmp"))
    path = path_with(control) if control is not None else os.environ.get("PATH", "")
    env = {"RUNTIME_DIRECTORY": str(work), "PATH": path}
    daemon = launch_daemon(write_config(config(), work / "config.yaml"), env)
    try:
        pipe = {"CUDA_MPS_PIPE_DIRECTORY": str(work / "mps" / "pipe")}
        result |= serve_and_look(daemon, control, pipe)
    except Exception as exc:
        result |= {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        try:
            result["daemon_exit"] = daemon.stop(timeout=30)
        except RuntimeError:
            result["daemon_exit"] = "killed after 30 s"
        result["mps_dir_removed"] = not (work / "mps").exists()
        result["log_tail"] = daemon.log()[-3000:]
    result["ok"] = bool(result.get("ok")) and result["mps_dir_removed"]
    log(f"MPS: ok={result['ok']} { ({k: v for k, v in result.items() if k != 'log_tail'}) }")
    dump(out_path, result)


def routed(daemon: Daemon, model: str) -> tuple[list[list[int]], list[list[int]]]:
    """The routed workload's token ids as served, and as the shaped weights make them."""

    def one(job: tuple[list[int], SamplingParams]) -> list[int]:
        prompt, params = job
        body = {"model": model, "prompt": prompt, "max_tokens": params.max_tokens,
                "ignore_eos": True, "temperature": 0, "return_token_ids": True}  # fmt: skip
        return list(http(daemon, "/v1/completions", body, 60)["choices"][0]["token_ids"])

    work = jobs(4 if DRY_RUN else 12)
    with ThreadPoolExecutor(4) as pool:
        served = list(pool.map(one, work))
    return served, [expected_tokens(p, sp.max_tokens, SCHEDULE) for p, sp in work]


def serve_and_look(daemon: Daemon, control: Path | None, env: dict[str, str]) -> dict[str, Any]:
    daemon.up(150)
    served, want = routed(daemon, http(daemon, "/v1/models")["data"][0]["id"])
    result: dict[str, Any] = {"tokens_exact": served == want,
                              "mismatch": first_mismatch(served, want)}  # fmt: skip
    result["engines"] = engines = engine_pids(daemon.proc.pid)
    if control is None:
        return {**result, "ok": result["tokens_exact"] and len(engines) == 2}
    result["seen"] = seen = mps_clients(control, env)
    listed = set(seen.get("nvml_mps", [])) | set(seen.get("nvidia_smi_pids", []))
    clients = all(pid in listed for pid in engines) and len(engines) == 2
    return {**result, "mps_clients": clients, "ok": clients and result["tokens_exact"]}


if __name__ == "__main__":
    main()
