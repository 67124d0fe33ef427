"""The daemon under managed MPS (`mps: required`): both engines must be MPS clients.

    python -m gpucheck.mps OUT.json

Finds nvidia-cuda-mps-control (PATH, the driver's folders, else the Debian package
scripts/gpu_check_prepare.sh carried in .gpu/mps), starts `tokenrouterd` with two
engines of the 0.6B-shaped checkpoint, serves one completion, then asks NVML (MPS
client processes), nvidia-smi (compute apps) and the control daemon (client list) which
processes use the GPU: each engine's pid must be among NVML's or nvidia-smi's. Stops the
daemon and checks that the MPS control daemon went with it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from gpucheck.common import SHAPED, dump, log

REPO = Path(__file__).resolve().parents[2]
CANDIDATES = ["/usr/local/nvidia/bin", "/usr/bin", "/usr/sbin", "/usr/local/bin",
              str(REPO / ".gpu/mps/root/usr/bin")]  # fmt: skip
PORT = 18231


def find_control() -> Path | None:
    found = shutil.which("nvidia-cuda-mps-control")
    if found:
        return Path(found)
    hits = (Path(d) / "nvidia-cuda-mps-control" for d in CANDIDATES)
    return next((p for p in hits if os.access(p, os.X_OK)), None)


def config() -> dict[str, Any]:
    model = str(SHAPED["small"])
    return {
        "listen": f"127.0.0.1:{PORT}", "admin": f"127.0.0.1:{PORT + 1}", "device": "cuda",
        "mps": "required", "memory": {"budget_gib": 24}, "max_model_len": 4096,
        "models": [{"name": "small", "path": model, "dtype": "bfloat16"},
                   {"name": "large", "path": model, "dtype": "bfloat16"}],
        "policy": {"name": "scripted", "schedule": [0, 1]}, "shutdown": {"grace_s": 5},
    }  # fmt: skip


def http(path: str, body: dict[str, Any] | None = None, timeout: float = 5) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=data,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def engine_pids(pid: int) -> list[int]:
    """The daemon's engine processes: its multiprocessing children (not the resource
    tracker, which multiprocessing also starts), spawned from whichever of its threads."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    kids = [int(c) for t in tasks for c in (t / "children").read_text().split()]
    return [k for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


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
    control = find_control()
    result: dict[str, Any] = {"control": str(control) if control else None}
    if control is None:
        dump(out_path, {"ok": False, **result, "error": "no nvidia-cuda-mps-control binary"})
        return
    log(f"MPS control binary: {control}")
    work = Path(tempfile.mkdtemp(prefix="trdmps-", dir="/tmp"))
    (work / "config.yaml").write_text(yaml.safe_dump(config()))
    server_dirs = [str(control.parent), str(control.parent.parent / "sbin")]
    env = {**os.environ, "RUNTIME_DIRECTORY": str(work),
           "PATH": os.pathsep.join([*server_dirs, os.environ.get("PATH", "")])}  # fmt: skip
    logf = (work / "daemon.log").open("w")
    daemon = subprocess.Popen([sys.executable, "-m", "trd.daemon", "--config",
                               str(work / "config.yaml")], env=env, stdout=logf,
                              stderr=subprocess.STDOUT)  # fmt: skip
    try:
        pipe = {"CUDA_MPS_PIPE_DIRECTORY": str(work / "mps" / "pipe")}
        result |= serve_and_look(daemon, control, pipe)
    except Exception as exc:
        result |= {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            result["daemon_exit"] = daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            result["daemon_exit"] = "killed after 30 s"
        result["mps_dir_removed"] = not (work / "mps").exists()
        result["log_tail"] = (work / "daemon.log").read_text()[-3000:]
    result["ok"] = bool(result.get("ok")) and result["mps_dir_removed"]
    log(f"MPS: ok={result['ok']} { ({k: v for k, v in result.items() if k != 'log_tail'}) }")
    dump(out_path, result)


def serve_and_look(
    daemon: subprocess.Popen[bytes], control: Path, env: dict[str, str]
) -> dict[str, Any]:
    deadline = time.monotonic() + 150
    while True:
        if daemon.poll() is not None:
            raise RuntimeError(f"the daemon exited with {daemon.returncode} while starting")
        try:
            if http("/health").get("status") == "ok":
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the daemon was not serving after 150 s")
        time.sleep(1)
    model = http("/v1/models")["data"][0]["id"]
    body = {"model": model, "prompt": "hello world", "max_tokens": 16}
    answer = http("/v1/completions", body, timeout=60)
    engines = engine_pids(daemon.pid)
    seen = mps_clients(control, env)
    listed = set(seen.get("nvml_mps", [])) | set(seen.get("nvidia_smi_pids", []))
    clients = all(pid in listed for pid in engines) and len(engines) == 2
    return {"completion": answer.get("choices", [{}])[0].get("text"), "engines": engines,
            "seen": seen, "ok": clients}  # fmt: skip


if __name__ == "__main__":
    main()
