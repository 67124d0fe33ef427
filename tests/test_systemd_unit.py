"""The systemd unit: systemd-analyze accepts it, its stop timing matches the drain, and
the daemon serves inside the unit's sandbox.

systemd is not PID 1 here (a VM's init), so `systemd-run` cannot start the unit; the
sandbox test builds the same confinement by hand, from the unit's settings, and runs the
real daemon in it: a mount namespace (unshare) where every file system is read-only
(ProtectSystem=strict, ProtectHome=read-only; /proc/sys and /sys too:
ProtectKernelTunables, ProtectControlGroups) but /dev (with /dev/shm, the rings), fresh
/tmp and /var/tmp (PrivateTmp), and the unit's runtime and cache directories; run as an
unprivileged uid with no supplementary groups (DynamicUser) and no new privileges
(NoNewPrivileges), HOME=/ and the unit's Environment=. Not emulated: the seccomp filters
(RestrictAddressFamilies, SystemCallArchitectures, RestrictNamespaces, LockPersonality,
RestrictRealtime, RestrictSUIDSGID), ProtectClock/Hostname/KernelModules/KernelLogs, the
StateDirectory (the daemon keeps no state) and the credentials directory.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trd.cli import request
from trd.daemon import EXIT_CONFIG
from trd.models.cache import readable_by_all

from daemon_fixture import REPO_ROOT, Daemon, shm_segments, wait_serving, write_config

SYSTEMD = Path(__file__).resolve().parent.parent / "systemd"
UNIT = SYSTEMD / "tokenrouterd.service"
EXAMPLE = SYSTEMD / "config.example.yaml"
# What an engine group's close() may take after the drain (SIGTERM, then SIGKILL).
ENGINE_STOP_S = 5


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    # verify checks that ExecStart's binary exists; point it at this interpreter.
    text = UNIT.read_text()
    exec_start = unit_settings()["ExecStart"][0]
    unit = tmp_path / "tokenrouterd.service"
    unit.write_text(text.replace(exec_start.split()[0], f"{sys.executable} -m trd.daemon"))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    # Unknown keys and unparsable values are only warnings; they name the file.
    problems = [line for line in done.stderr.splitlines() if unit.name in line]
    assert done.returncode == 0 and not problems, done.stderr


def test_unit_is_notify_type_and_outlasts_the_drain() -> None:
    s = unit_settings()
    assert s["Type"] == ["notify"]
    assert s["Restart"] == ["on-failure"]
    assert s["RestartPreventExitStatus"] == [str(EXIT_CONFIG)]
    assert s["KillMode"] == ["mixed"]  # SIGTERM to the supervisor, which stops its engines
    assert s["ExecStart"][0].endswith("--config /etc/tokenrouter/config.yaml")
    grace = yaml.safe_load(EXAMPLE.read_text())["shutdown"]["grace_s"]
    assert int(s["TimeoutStopSec"][0]) >= grace + ENGINE_STOP_S


def test_sandbox_keeps_shared_memory_and_gpu_nodes() -> None:
    s = unit_settings()
    assert s.get("PrivateDevices", ["no"]) == ["no"]
    assert "PrivateIPC" not in s
    assert s["ProtectSystem"] == ["strict"]  # /dev (with /dev/shm) is outside its reach
    assert "InaccessiblePaths" not in s


def test_flashinfer_compiles_into_the_units_cache_directory() -> None:
    """flashinfer's JIT cache defaults to the home directory, read-only in the sandbox."""
    s = unit_settings()
    env = dict(e.split("=", 1) for e in s["Environment"])
    assert env["FLASHINFER_WORKSPACE_BASE"] == f"/var/cache/{s['CacheDirectory'][0]}"


def test_api_keys_come_from_a_credential_or_an_optional_environment_file() -> None:
    """Never from the unit's text; the credential's path is the one the example config names."""
    s = unit_settings()
    assert s["EnvironmentFile"] == ["-/etc/tokenrouter/env"]  # "-": none is fine
    assert not any(e.startswith(("TRD_API_KEY", "VLLM_API_KEY")) for e in s["Environment"])
    credential = re.search(r"^#\s+LoadCredential=(\S+):(\S+)$", UNIT.read_text(), re.M)
    assert credential, "the unit documents LoadCredential"
    example = yaml.safe_load(re.sub(r"^# (api_key_file:)", r"\1", EXAMPLE.read_text(), flags=re.M))
    assert example["api_key_file"] == f"/run/credentials/{UNIT.name}/{credential[1]}"


def test_flashinfers_compiler_and_ninja_are_on_the_units_path() -> None:
    """flashinfer compiles kernels at first start: nvcc from CUDA_HOME, `ninja` from PATH,
    which pip installs next to tokenrouterd (ExecStart's directory)."""
    s = unit_settings()
    env = dict(e.split("=", 1) for e in s["Environment"])
    path = env["PATH"].split(":")
    assert f"{env['CUDA_HOME']}/bin" in path
    assert str(Path(s["ExecStart"][0].split()[0]).parent) in path


SERVICE_UID = 61234  # in systemd's range for DynamicUser= (61184-65519)
# The confinement, built in a fresh mount namespace; then the daemon runs as SERVICE_UID.
SANDBOX = """
set -eu
mount --make-rprivate /
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/{runtime} /run/config
mount --bind "$RUNTIME" /run/{runtime}
mount --bind "$CONFIG" /run/config
mount -t tmpfs -o mode=0755 tmpfs /var/cache
mkdir -p /var/cache/{cache}
mount --bind "$CACHE" /var/cache/{cache}
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /var/tmp
mount --bind /proc/sys /proc/sys
{expose}
for m in / /run /var/cache /run/config /proc/sys /sys {closed}; do
    mount -o remount,bind,ro "$m"
done
exec setpriv --reuid={uid} --regid={uid} --clear-groups --no-new-privs \\
    env -i {env} "$PYTHON" -m trd.daemon --config /run/config/config.yaml \\
    --ready-file /run/{runtime}/ready.json
"""


def closed_ancestor(path: Path) -> Path | None:
    """The outermost folder above `path` that others may not enter (a Python installed
    under /root, say), if any."""
    return next((p for p in reversed(path.parents) if not p.stat().st_mode & stat.S_IXOTH), None)


def expose(path: Path) -> tuple[str, str]:
    """Shell lines that let any user reach `path` (only it) through a closed ancestor: the
    interpreter's installation, which a real host keeps under /usr or /opt."""
    closed = closed_ancestor(path)
    if closed is None:
        return "", ""
    lines = f"""mkdir -p /run/exposed
mount --bind {path} /run/exposed
mount -t tmpfs -o mode=0755 tmpfs {closed}
mkdir -p {path}
mount --bind /run/exposed {path}"""
    return lines, str(closed)


def sandbox_script(env: dict[str, str]) -> str:
    s = unit_settings()
    # What the script emulates must still be what the unit asks for.
    wanted = {"ProtectSystem": "strict", "ProtectHome": "read-only", "PrivateTmp": "yes",
              "DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectKernelTunables": "yes",
              "ProtectControlGroups": "yes", "PrivateDevices": "no"}  # fmt: skip
    assert {k: s[k][0] for k in wanted} == wanted
    words = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    lines, closed = expose(Path(sys.base_prefix))
    return SANDBOX.format(runtime=s["RuntimeDirectory"][0], cache=s["CacheDirectory"][0],
                          uid=SERVICE_UID, env=words, expose=lines, closed=closed)  # fmt: skip


def connects_as(uid: int, path: Path) -> str:
    """What connecting to the unix socket at `path` as `uid` gives: "ok" or the error."""
    code = f"import socket; socket.socket(socket.AF_UNIX).connect({str(path)!r}); print('ok')"
    done = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


@pytest.mark.skipif(os.geteuid() != 0, reason="building the unit's sandbox needs root (unshare)")
def test_the_daemon_serves_in_the_units_sandbox(
    tmp_path: Path, tiny_models: dict[str, Path]
) -> None:
    """Rings in /dev/shm and the admin socket work under the unit's confinement: the
    socket is 0600 and the service user's (root may steer, another user may not), the
    segments are the service user's and go at the stop, a completion is served."""
    dirs = {name: tmp_path / name for name in ("runtime", "config", "cache")}
    for folder in dirs.values():
        folder.mkdir()
        folder.chmod(0o755)
    for folder in (dirs["runtime"], dirs["cache"]):
        os.chown(folder, SERVICE_UID, SERVICE_UID)  # systemd hands them to the dynamic user
    # The fixture cache may predate readable_by_all (its build ran as root, files 0600):
    # the service reads a copy beside its config (/tmp is private to it).
    shutil.copytree(tiny_models["small"], dirs["config"] / "small")
    readable_by_all(dirs["config"] / "small")
    models = {"small": Path("/run/config/small")}  # where the service sees it
    unit = unit_settings()
    runtime = unit["RuntimeDirectory"][0]
    admin = f"unix:/run/{runtime}/admin.sock"
    written = write_config(dirs["config"], models, ["small"], admin=admin)
    env = dict(e.split("=", 1) for e in unit["Environment"]) | {
        "HOME": "/", "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO_ROOT)),
        "RUNTIME_DIRECTORY": f"/run/{runtime}"}  # fmt: skip
    script = sandbox_script(env)
    log_path = tmp_path / "daemon.log"
    outside = {k.upper(): str(v) for k, v in dirs.items()}
    outside |= {"PYTHON": sys.executable, "PATH": os.environ["PATH"]}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(["unshare", "--mount", "sh", "-c", script], stdout=log,
                                stderr=subprocess.STDOUT, env=outside)  # fmt: skip
    # Its ready file (the ports it bound) and admin socket, seen from here.
    ready, sock = dirs["runtime"] / "ready.json", dirs["runtime"] / "admin.sock"
    config = yaml.safe_load(written.read_text())
    d = wait_serving(Daemon("sandboxed", proc, log_path, ready, health="/ready", config=config,
                            config_path=written))  # fmt: skip
    try:
        info = sock.stat()
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o600, SERVICE_UID)
        assert request(f"unix:{sock}", "GET", "/status")["state"] == "serving"  # root may
        assert "Permission denied" in connects_as(SERVICE_UID + 1, sock)  # others may not
        segments = shm_segments(proc.pid)
        assert segments and {os.stat(f"/dev/shm/{n}").st_uid for n in segments} == {SERVICE_UID}
        out = d.client().completions.create(model=d.model, prompt="def f(", max_tokens=4)
        assert out.usage is not None and out.usage.completion_tokens == 4
    finally:
        code = d.stop()
    assert code == 0, d.log()
    assert shm_segments(proc.pid) == []
