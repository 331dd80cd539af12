"""Validators built once per session from the official schemas in ../shared/schemas (see its README)."""

import json
from pathlib import Path

import pytest

SCHEMAS = Path(__file__).resolve().parents[2].parent / "shared" / "schemas"
VENDORED = Path(__file__).resolve().parent / "schemas"  # copies in the repository (schemas/README.md); used first


def _strict_definitions(path: Path, what: str) -> dict:
    """An Argo JSON schema bundle (schema.json or swagger.json) whose object definitions reject unknown fields."""
    if not path.is_file():
        pytest.skip(f"official {what} not found at {path} (the shared/ folder sits beside the repo in CI)")
    bundle = json.loads(path.read_text())
    defs = bundle["definitions"]
    # The files render IntOrString and Quantity as plain strings; the API server accepts numbers for both.
    defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["integer", "string"]}
    defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {"type": ["integer", "number", "string"]}
    for definition in defs.values():  # kubectl --validate=strict: a misspelled field is an error
        if definition.get("type") == "object" and "properties" in definition:
            definition.setdefault("additionalProperties", False)
    return bundle


def _crd_schema(path: Path, version: str) -> dict:
    """The strict openAPIV3Schema of one version of an official CRD file."""
    import yaml

    if not path.is_file():
        pytest.skip(f"official CRD not found at {path}")
    crd = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
    return _strictify(next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"])


@pytest.fixture(scope="session")
def argo_validator():
    """Strict (unknown fields rejected) validator factory for an Argo kind, from argo/schema.json."""
    from jsonschema import Draft202012Validator

    bundle = _strict_definitions(SCHEMAS / "argo" / "schema.json", "Argo schema")
    defs = bundle["definitions"]

    def validator(kind: str) -> Draft202012Validator:
        return Draft202012Validator(
            {
                "$schema": bundle["$schema"],
                "$ref": f"#/definitions/io.argoproj.workflow.v1alpha1.{kind}",
                "definitions": defs,
            }
        )

    return validator


def _strictify(node):
    """Unknown fields become errors (kubectl --validate=strict), except in maps and preserve-unknown nodes."""
    if isinstance(node, dict):
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
            and not node.get("x-kubernetes-embedded-resource")
        ):
            node["additionalProperties"] = False
        for child in node.get("properties", {}).values():
            _strictify(child)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                _strictify(node[key])
        for child in node.get("anyOf", []) + node.get("allOf", []) + node.get("oneOf", []):
            _strictify(child)
    return node


CRDS = {
    ("ray.io", "RayJob"): "kuberay/ray.io_rayjobs.yaml",
    ("batch.volcano.sh", "Job"): "volcano/batch.volcano.sh_jobs.yaml",
    ("scheduling.volcano.sh", "PodGroup"): "volcano/scheduling.volcano.sh_podgroups.yaml",
    ("kubeflow.org", "MPIJob"): "mpi-operator/kubeflow.org_mpijobs.yaml",
}


@pytest.fixture(scope="session")
def crd_validator():
    """Strict validator for a custom resource manifest, from its official CRD (built once per kind and version)."""
    from jsonschema import Draft202012Validator

    cache = {}

    def validator(manifest) -> Draft202012Validator:
        group, version = manifest["apiVersion"].split("/")
        key = (group, manifest["kind"], version)
        if key not in cache:
            relative = CRDS[(group, manifest["kind"])]
            path = VENDORED / relative if (VENDORED / relative).is_file() else SCHEMAS / relative
            cache[key] = Draft202012Validator(_crd_schema(path, version))
        return cache[key]

    return validator


@pytest.fixture(scope="session")
def swagger_validator():
    """Strict validator for an Argo Server REST API body definition, from argo/swagger.json."""
    from jsonschema import Draft202012Validator

    defs = _strict_definitions(SCHEMAS / "argo" / "swagger.json", "Argo API spec")["definitions"]

    def validator(name: str) -> Draft202012Validator:
        return Draft202012Validator({"$ref": f"#/definitions/{name}", "definitions": defs})

    return validator


@pytest.fixture(scope="session")
def kueue_validator():
    """Strict validator for a Kueue object, from its CRD and the version in its apiVersion."""
    from jsonschema import Draft202012Validator

    files = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues"}

    def validator(manifest) -> Draft202012Validator:
        path = SCHEMAS / "kueue" / f"kueue.x-k8s.io_{files[manifest['kind']]}.yaml"
        return Draft202012Validator(_crd_schema(path, manifest["apiVersion"].split("/")[1]))

    return validator
