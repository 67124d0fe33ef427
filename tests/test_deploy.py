"""deploy/kubernetes/: every manifest passes its API's schema, and the pieces agree.

Kubernetes' own kinds are validated with the PyPI package kubernetes-validate (its strict
schemas: unknown fields fail), against the oldest Kubernetes these manifests claim
(1.30: `lifecycle.preStop.sleep`) and the newest it knows. The CRD kinds (HTTPRoute,
InferencePool) are validated against our own schemas in deploy/kubernetes/schemas/,
written from the published API references (the README there says which). A manifest of
a kind neither knows fails.

The consistency checks read the daemon's side from the daemon itself: the ConfigMap's
config goes through trd.config (with the fixture checkpoints standing in for the model
volume), the probe paths are looked up in the route table of the API's app factory.
"""

from __future__ import annotations

import copy
import inspect
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from trd.config import Config, from_dict
from trd.daemon import HANDLER_SHUTDOWN_S
from trd.frontend.app import OpenAIApi, Served
from trd.frontend.auth import KEY_ENVS, PROBES
from trd.frontend.metrics import Metrics
from trd.frontend.tokens import PromptEncoder
from trd.mps.manager import QUIT_TIMEOUT_S, MpsManager
from trd.supervisor.group import EngineGroup
from trd.supervisor.hub import Hub
from trd.supervisor.keeper import START_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
CRD_SCHEMAS = DEPLOY / "schemas" / "gateway-crds.json"
KUBERNETES = ["1.30", kubernetes_validate.latest_version()]
# What the daemon uses: EngineGroup.close SIGKILLs engines left after its grace; one ring
# per direction between every pair of nodes has the group's ring capacity.
ENGINE_STOP_S = inspect.signature(EngineGroup.close).parameters["grace"].default
RING_BYTES = inspect.signature(EngineGroup).parameters["ring_capacity"].default
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


def crd_validator(kind: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(CRD_SCHEMAS.read_text())
    if kind not in schema["$defs"]:
        pytest.fail(f"{kind}: no schema in {CRD_SCHEMAS.name} or kubernetes-validate")
    return jsonschema.Draft202012Validator({**schema, "$ref": f"#/$defs/{kind}"})


def crd_errors(doc: dict[str, Any]) -> list[str]:
    return [f"{e.json_path}: {e.message}" for e in crd_validator(doc["kind"]).iter_errors(doc)]


def test_kustomization_lists_every_manifest() -> None:
    on_disk = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(resources()) == sorted(on_disk)


@pytest.mark.parametrize("version", KUBERNETES)
@pytest.mark.parametrize("name", resources())
def test_manifest_matches_its_schema(name: str, version: str) -> None:
    doc = load(name)
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        pytest.fail(f"{name} on Kubernetes {version}: {path}: {exc.message}")
    except kubernetes_validate.SchemaNotFoundError:  # not a Kubernetes kind: a CRD's
        assert not crd_errors(doc), f"{name}: " + "; ".join(crd_errors(doc))


def test_core_validation_is_strict() -> None:
    """A misspelt field is an error, not ignored (kubectl's server-side validation agrees)."""
    doc = copy.deepcopy(by_kind("Deployment"))
    doc["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(doc, KUBERNETES[0], strict=True)


# Each edit breaks a documented rule; our CRD schemas must refuse every one.
BROKEN = {
    "InferencePool": [
        ("an unknown field", lambda d: d["spec"].update(replicas=2)),
        ("nine target ports", lambda d: d["spec"].update(
            targetPorts=[{"number": 8000 + i} for i in range(9)])),
        ("a port twice", lambda d: d["spec"].update(targetPorts=[{"number": 8000}] * 2)),
        ("port 0", lambda d: d["spec"].update(targetPorts=[{"number": 0}])),
        ("no selector", lambda d: d["spec"].pop("selector")),
        ("an empty selector", lambda d: d["spec"]["selector"].update(matchLabels={})),
        ("a bad failure mode", lambda d: d["spec"]["endpointPickerRef"].update(
            failureMode="Retry")),
        ("a Service picker without port", lambda d: d["spec"]["endpointPickerRef"].pop("port")),
        ("a bad app protocol", lambda d: d["spec"].update(appProtocol="grpc")),
    ],
    "HTTPRoute": [
        ("an unknown field", lambda d: d["spec"]["rules"][0].update(retries=3)),
        ("a bad timeout", lambda d: d["spec"]["rules"][0]["timeouts"].update(request="10min")),
        ("a relative path", lambda d: d["spec"]["rules"][0]["matches"][0]["path"].update(
            value="v1")),
        ("a bad match type", lambda d: d["spec"]["rules"][0]["matches"][0]["path"].update(
            type="Prefix")),
        ("seventeen rules", lambda d: d["spec"].update(rules=d["spec"]["rules"] * 17)),
        ("a Service backend without port", lambda d: d["spec"]["rules"][0].update(
            backendRefs=[{"name": "tokenrouterd"}])),
        ("an unnamed parent", lambda d: d["spec"]["parentRefs"][0].pop("name")),
    ],
}  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "edit"),
    [pytest.param(k, e, id=f"{k}: {what}") for k, cases in BROKEN.items() for what, e in cases],
)
def test_crd_schemas_refuse_what_the_reference_forbids(kind: str, edit: Any) -> None:
    doc = copy.deepcopy(by_kind(kind))
    assert not crd_errors(doc)
    edit(doc)
    assert crd_errors(doc)


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
    served = Served(["small"], PromptEncoder(path), 64, 0, 0, "scripted")
    hub = Hub(1)
    metrics = Metrics(dict, hub.gens.values, "small", ())
    app = OpenAIApi(served, hub, metrics, max_stored_responses=1).app()
    return {r.resource.canonical for r in app.router.routes() if r.method == "GET" and r.resource}


def pod_spec() -> dict[str, Any]:
    return dict(by_kind("Deployment")["spec"]["template"]["spec"])


def container() -> dict[str, Any]:
    (c,) = pod_spec()["containers"]
    return dict(c)


def env() -> dict[str, str]:
    """The container's literal environment (not the variables taken from a Secret)."""
    return {e["name"]: e["value"] for e in container().get("env", []) if "value" in e}


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


@pytest.mark.parametrize(
    ("probe", "path"),
    [("startupProbe", "/health"), ("livenessProbe", "/health"), ("readinessProbe", "/ready")],
)
def test_probes_call_liveness_and_readiness(probe: str, path: str, routes: set[str]) -> None:
    """Liveness must not be readiness: an engine restart or a drain would kill the pod."""
    get = container()[probe]["httpGet"]
    assert port_number(get["port"]) == http_port()
    assert get["path"] == path and path in routes, f"{probe}: {get['path']}; served: {routes}"


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
    assert quantity(shm["sizeLimit"]) >= n * (n + 1) * RING_BYTES  # a ring per direction
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


def test_the_api_keys_come_from_a_secret_the_manifests_do_not_hold(config: Config) -> None:
    (entry,) = [e for e in container()["env"] if e["name"] in KEY_ENVS]
    ref = entry["valueFrom"]["secretKeyRef"]
    assert "value" not in entry and not ref.get("optional"), "no key: the pod must not start"
    assert "Secret" not in [d["kind"] for d in map(load, resources())]
    command = f"kubectl create secret generic {ref['name']} --from-file={ref['key']}="
    assert command in (DEPLOY / "deployment.yaml").read_text()
    assert config.api_key_file is None  # the Secret is the one source
    # The kubelet's probes and the endpoint picker send no key.
    probes = {container()[p]["httpGet"]["path"] for p in ("startupProbe", "readinessProbe")}
    assert probes <= set(PROBES)
    assert not config.api_key_metrics
