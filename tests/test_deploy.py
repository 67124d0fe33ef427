"""deploy/kubernetes/: every manifest passes its API's schema, and the pieces agree.

Schemas are picked by apiVersion and kind (`<kind>-<apiVersion, '/' as '-'>.json`) from
deploy/kubernetes/schemas/ (Kubernetes' own kinds) or, for the CRD kinds, from the
steering repository's shared/k8s-schemas/ (deploy/kubernetes/schemas/README.md says
why and where each file comes from). A manifest without a schema fails.

The consistency checks read the daemon's side from the daemon itself: the ConfigMap's
config goes through trd.config (with the fixture checkpoints standing in for the model
volume), the probe paths are looked up in the route table of the API's app factory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from trd.config import Config, from_dict
from trd.daemon import HANDLER_SHUTDOWN_S
from trd.frontend.app import OpenAIApi, Served
from trd.frontend.hub import Hub
from trd.frontend.metrics import Metrics
from trd.frontend.tokens import PromptEncoder
from trd.ipc.mesh import DEFAULT_CAPACITY
from trd.mps.manager import QUIT_TIMEOUT_S, MpsManager
from trd.supervisor import START_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
# shared/ sits in the checkout on some machines and beside it on others (CI, worktrees).
SCHEMA_DIRS = [DEPLOY / "schemas", *(d / "shared" / "k8s-schemas" for d in (ROOT, ROOT.parent))]
# EngineGroup.close: SIGTERM to the engines, SIGKILL after this.
ENGINE_STOP_S = 5
# The endpoint picker scrapes this path (its --model-server-metrics-path default).
EPP_METRICS_PATH = "/metrics"
QUANTITY = re.compile(r"^([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
UNITS = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
         "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip


def resources() -> list[str]:
    return list(yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"])


def load(name: str) -> dict[str, Any]:
    (doc,) = yaml.safe_load_all((DEPLOY / name).read_text())
    return dict(doc)


def by_kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in map(load, resources()) if d["kind"] == kind]
    return doc


def quantity(value: str | int) -> float:
    match = QUANTITY.match(str(value))
    assert match, f"not a Kubernetes quantity: {value!r}"
    return float(match[1]) * UNITS[match[2]]


def schema_for(name: str, doc: dict[str, Any]) -> dict[str, Any]:
    file = f"{doc['kind'].lower()}-{doc['apiVersion'].replace('/', '-')}.json"
    for folder in SCHEMA_DIRS:
        if (folder / file).is_file():
            return dict(json.loads((folder / file).read_text()))
    looked = ", ".join(str(d) for d in SCHEMA_DIRS)
    pytest.fail(f"{name}: no schema {file} for {doc['apiVersion']} {doc['kind']} in {looked}")


def test_kustomization_lists_every_manifest() -> None:
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(resources()) == sorted(on_disk)


@pytest.mark.parametrize("name", resources())
def test_manifest_matches_its_schema(name: str) -> None:
    doc = load(name)
    validator = jsonschema.Draft202012Validator(schema_for(name, doc))
    errors = [f"{name}: {e.json_path}: {e.message}" for e in validator.iter_errors(doc)]
    assert not errors, "\n".join(errors)


# -- the daemon's side --------------------------------------------------------------------
@pytest.fixture(scope="module")
def config(tiny_models: dict[str, Path]) -> Config:
    """The ConfigMap's config as the daemon loads it, fixture checkpoints as the models."""
    raw = yaml.safe_load(by_kind("ConfigMap")["data"]["config.yaml"])
    for model in raw["models"]:
        model["path"] = str(tiny_models[model["name"]])
    return from_dict(raw, DEPLOY)


@pytest.fixture(scope="module")
def routes(tiny_models: dict[str, Path]) -> set[str]:
    """GET paths of the app the daemon serves on `listen` (no engines needed to build it)."""
    path = tiny_models["small"]
    served = Served(["small"], PromptEncoder(path), 64, 0, 0)
    app = OpenAIApi(served, Hub(1), Metrics(dict, lambda: 0)).app()
    return {r.resource.canonical for r in app.router.routes() if r.method == "GET" and r.resource}


def pod_spec() -> dict[str, Any]:
    return dict(by_kind("Deployment")["spec"]["template"]["spec"])


def container() -> dict[str, Any]:
    (c,) = pod_spec()["containers"]
    return dict(c)


def env() -> dict[str, str]:
    return {e["name"]: e["value"] for e in container().get("env", [])}


def http_port() -> int:
    (port,) = [p for p in container()["ports"] if p.get("name") == "http"]
    return int(port["containerPort"])


def port_number(port: str | int) -> int:
    """A probe's or Service's port, resolving a name against the container's ports."""
    if isinstance(port, int):
        return port
    (match,) = [p["containerPort"] for p in container()["ports"] if p.get("name") == port]
    return int(match)


def writable_mounts() -> dict[str, dict[str, Any]]:
    """mountPath -> the emptyDir source of every writable emptyDir mount."""
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    return {
        m["mountPath"]: volumes[m["name"]]["emptyDir"]
        for m in container()["volumeMounts"]
        if "emptyDir" in volumes[m["name"]] and not m.get("readOnly")
    }


def test_the_config_map_is_a_config_the_daemon_loads(config: Config) -> None:
    cmd = container()["command"]
    config_path = Path(cmd[cmd.index("--config") + 1])
    (mount,) = [m for m in container()["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    (volume,) = [v for v in pod_spec()["volumes"] if v["name"] == mount["name"]]
    configmap = by_kind("ConfigMap")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert config_path.name in configmap["data"]
    assert config.device == "cuda", "a pod that got no GPU must fail, not serve on CPU"


def test_listen_port_is_the_port_of_container_service_and_pool(config: Config) -> None:
    assert not config.listen.is_loopback, f"listen {config.listen}: unreachable from the pod IP"
    assert config.listen.port == http_port()
    (svc_port,) = by_kind("Service")["spec"]["ports"]
    assert port_number(svc_port["targetPort"]) == http_port()
    pool = by_kind("InferencePool")["spec"]
    assert [p["number"] for p in pool["targetPorts"]] == [http_port()]


# Strict: once the daemon serves /ready this XPASS fails, to have the mark removed.
READY_PENDING = pytest.mark.xfail(strict=True, reason="GET /ready comes with a daemon change")


@pytest.mark.parametrize(
    "probe", ["startupProbe", "livenessProbe", pytest.param("readinessProbe", marks=READY_PENDING)]
)
def test_probes_call_endpoints_the_daemon_serves(probe: str, routes: set[str]) -> None:
    get = container()[probe]["httpGet"]
    assert port_number(get["port"]) == http_port()
    assert get["path"] in routes, f"{probe} calls {get['path']}; the daemon serves {routes}"


def test_the_endpoint_picker_finds_the_metrics(routes: set[str]) -> None:
    assert EPP_METRICS_PATH in routes


def test_startup_probe_waits_longer_than_the_engines_may_load() -> None:
    probe = container()["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= START_TIMEOUT_S


def test_termination_grace_outlasts_prestop_drain_and_stop(config: Config) -> None:
    pre_stop = container()["lifecycle"]["preStop"]["sleep"]["seconds"]
    stop = config.grace_s + HANDLER_SHUTDOWN_S + ENGINE_STOP_S + QUIT_TIMEOUT_S
    assert pod_spec()["terminationGracePeriodSeconds"] > pre_stop + stop


def test_pool_service_and_deployment_select_the_pods() -> None:
    labels = by_kind("Deployment")["spec"]["template"]["metadata"]["labels"]
    selectors = {
        "Deployment": by_kind("Deployment")["spec"]["selector"]["matchLabels"],
        "Service": by_kind("Service")["spec"]["selector"],
        "InferencePool": by_kind("InferencePool")["spec"]["selector"]["matchLabels"],
    }
    for kind, selector in selectors.items():
        assert selector, f"{kind} selects every pod"
        assert selector.items() <= labels.items(), f"{kind} {selector} misses pods {labels}"


def test_the_route_sends_to_the_pool() -> None:
    (rule,) = by_kind("HTTPRoute")["spec"]["rules"]
    (ref,) = rule["backendRefs"]
    pool = by_kind("InferencePool")["metadata"]["name"]
    assert (ref["group"], ref["kind"], ref["name"]) == (
        "inference.networking.k8s.io", "InferencePool", pool
    )  # fmt: skip


def test_everything_the_daemon_writes_is_on_a_writable_volume(config: Config) -> None:
    assert container()["securityContext"]["readOnlyRootFilesystem"] is True
    runtime = Path(env()["RUNTIME_DIRECTORY"])
    for path in (runtime, env()["HOME"], "/tmp", "/dev/shm"):
        assert str(path) in writable_mounts(), f"{path} is on the read-only root filesystem"
    MpsManager(runtime)  # raises if the MPS socket paths would be too long
    assert runtime in Path(config.admin.path).parents
    assert env()["TRCTL_ADMIN"] == str(config.admin)  # `kubectl exec ... trctl status`


def test_shm_holds_the_rings_and_counts_against_the_memory_limit(config: Config) -> None:
    shm = writable_mounts()["/dev/shm"]
    n = len(config.models)
    assert shm["medium"] == "Memory"
    assert quantity(shm["sizeLimit"]) >= n * (n + 1) * DEFAULT_CAPACITY  # a ring per direction
    limits = container()["resources"]["limits"]
    assert quantity(limits["memory"]) > quantity(shm["sizeLimit"])


def test_engine_threads_fit_the_cpu_limit_and_one_gpu_is_asked_for(config: Config) -> None:
    limits = container()["resources"]["limits"]
    assert config.engine.threads is not None, "threads: auto counts the node's cores"
    assert config.engine.threads * len(config.models) <= quantity(limits["cpu"])
    assert limits["nvidia.com/gpu"] == "1" == container()["resources"]["requests"]["nvidia.com/gpu"]


def test_pod_keeps_host_namespaces_and_privileges_out() -> None:
    spec, sc = pod_spec(), container()["securityContext"]
    assert not any(spec.get(k) for k in ("hostIPC", "hostPID", "hostNetwork"))
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert sc["allowPrivilegeEscalation"] is False and not sc.get("privileged")
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
