"""Write the JSON Schemas that tests/test_deploy.py validates deploy/kubernetes/ against.

    python scripts/vendor_k8s_schemas.py OUT_DIR --wheel kubernetes_validate-1.37.0-*.whl \
        --kubernetes v1.35.0 --core deployment-apps-v1 service-v1 configmap-v1
    python scripts/vendor_k8s_schemas.py OUT_DIR --crd httproutes.yaml inferencepools.yaml

Core kinds come from the kubernetes-validate wheel (PyPI), which ships the
openapi2jsonschema output of each Kubernetes release in the "local-strict" flavour: one
file per kind whose $refs point into a shared 1.5 MB _definitions.json. CRD kinds come
from their project's CustomResourceDefinition YAML (the storage version's
openAPIV3Schema). Every output is one self-contained Draft 2020-12 schema named
`<kind>-<apiVersion, '/' as '-'>.json` (lower-case kind), the name the test looks up:

- core: the kind's schema plus, under $defs, only the definitions it reaches;
- CRD: made strict like the core flavour: `additionalProperties: false` on each object
  that lists properties and has no rule of its own for other keys, since the API server's
  strict field validation (kubectl's default) rejects unknown fields;
- `description` and `x-kubernetes-validations` dropped: they are most of the bytes and
  jsonschema checks neither (CEL rules are the API server's).
"""

from __future__ import annotations

import argparse
import json
import zipfile
from pathlib import Path
from typing import Any

import yaml

DRAFT = "https://json-schema.org/draft/2020-12/schema"
WHEEL_DIR = "kubernetes_validate/kubernetes-json-schema/{version}-local-strict/"
DEFS_FILE = "/api/_definitions.json"
DEFS_PREFIX = "#/$defs/"
# Keywords whose value maps names to schemas: their keys are field names, not keywords.
NAME_MAPS = ("properties", "patternProperties", "$defs", "definitions")
DROPPED = ("description", "x-kubernetes-validations")


def out_name(api_version: str, kind: str) -> str:
    return f"{kind.lower()}-{api_version.replace('/', '-')}.json"


def strip(schema: Any) -> Any:
    """A copy of `schema` without the DROPPED keywords, at any depth."""
    if isinstance(schema, list):
        return [strip(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in DROPPED:
            continue
        if key in NAME_MAPS and isinstance(value, dict):
            out[key] = {name: strip(sub) for name, sub in value.items()}
        else:
            out[key] = strip(value)
    return out


def refs(schema: Any) -> set[str]:
    """Names of every definition `schema` refers to, directly."""
    if isinstance(schema, list):
        return set().union(*(refs(s) for s in schema)) if schema else set()
    if not isinstance(schema, dict):
        return set()
    found = set().union(*(refs(v) for v in schema.values())) if schema else set()
    ref = schema.get("$ref")
    if isinstance(ref, str):
        found.add(ref.removeprefix(DEFS_FILE).removeprefix(DEFS_PREFIX))
    return found


def relocal(schema: Any) -> Any:
    """`schema` with refs into _definitions.json rewritten to this document's $defs."""
    if isinstance(schema, list):
        return [relocal(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: relocal(v) for k, v in schema.items()}
    if isinstance(out.get("$ref"), str):
        out["$ref"] = DEFS_PREFIX + out["$ref"].removeprefix(DEFS_FILE).removeprefix(DEFS_PREFIX)
    return out


def core_schema(wheel: zipfile.ZipFile, version: str, name: str) -> tuple[str, dict[str, Any]]:
    base = WHEEL_DIR.format(version=version)
    top = json.loads(wheel.read(base + name + ".json"))
    defs = json.loads(wheel.read(base + "_definitions.json"))["$defs"]
    needed: set[str] = set()
    todo = refs(top)
    while todo:
        ref = todo.pop()
        if ref not in needed:
            needed.add(ref)
            todo |= refs(defs[ref])
    top.pop("$id", None)
    top["$schema"] = DRAFT
    top["$defs"] = {ref: defs[ref] for ref in sorted(needed)}
    (gvk,) = top["x-kubernetes-group-version-kind"]
    api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
    return out_name(api_version, gvk["kind"]), strip(relocal(top))


def make_strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [make_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in NAME_MAPS and isinstance(value, dict):
            out[key] = {name: make_strict(sub) for name, sub in value.items()}
        else:
            out[key] = make_strict(value)
    open_ended = "additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and not open_ended:
        out["additionalProperties"] = False
    return out


def crd_schema(path: Path) -> tuple[str, dict[str, Any]]:
    crd = yaml.safe_load(path.read_text())
    spec = crd["spec"]
    (version,) = [v for v in spec["versions"] if v.get("storage")]
    api_version = f"{spec['group']}/{version['name']}"
    schema = {"$schema": DRAFT, **make_strict(version["schema"]["openAPIV3Schema"])}
    return out_name(api_version, spec["names"]["kind"]), strip(schema)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--wheel", type=Path, help="kubernetes_validate-*.whl")
    p.add_argument("--kubernetes", default="v1.35.0", help="release folder in the wheel")
    p.add_argument("--core", nargs="*", default=[], help="schema names, e.g. service-v1")
    p.add_argument("--crd", nargs="*", type=Path, default=[], help="CRD YAML files")
    args = p.parse_args()
    if args.core and args.wheel is None:
        p.error("--core needs --wheel")
    schemas = [crd_schema(path) for path in args.crd]
    if args.core:
        with zipfile.ZipFile(args.wheel) as wheel:
            schemas += [core_schema(wheel, args.kubernetes, name) for name in args.core]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, schema in schemas:
        out = args.out_dir / name
        out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
        print(f"{out}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
