"""Validators built once per session from the official schemas vendored in tests/contract/schemas (its README)."""

import gzip
import hashlib
import json
from pathlib import Path

import pytest

SCHEMAS = Path(__file__).resolve().parent / "schemas"


def schema_text(name: str) -> str:
    """An upstream schema file (e.g. `argo/schema.json`), decompressed and checked against SHA256SUMS."""
    data = gzip.decompress((SCHEMAS / f"{name}.gz").read_bytes())
    sums = dict(line.split()[::-1] for line in (SCHEMAS / "SHA256SUMS").read_text().splitlines())
    assert hashlib.sha256(data).hexdigest() == sums[name], f"{name} differs from the upstream file (SHA256SUMS)"
    return data.decode()


def _strict_definitions(name: str) -> dict:
    """An Argo JSON schema bundle (schema.json or swagger.json) whose object definitions reject unknown fields."""
    bundle = json.loads(schema_text(name))
    defs = bundle["definitions"]
    # The files render IntOrString and Quantity as plain strings; the API server accepts numbers for both.
    defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["integer", "string"]}
    defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {"type": ["integer", "number", "string"]}
    for definition in defs.values():  # kubectl --validate=strict: a misspelled field is an error
        if definition.get("type") == "object" and "properties" in definition:
            definition.setdefault("additionalProperties", False)
    return bundle


def _crd_schema(name: str, version: str) -> dict:
    """The strict openAPIV3Schema of one version of an official CRD file."""
    import yaml

    crd = yaml.load(schema_text(name), Loader=yaml.CSafeLoader)
    return _strictify(next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"])


@pytest.fixture(scope="session")
def argo_validator():
    """Strict (unknown fields rejected) validator factory for an Argo kind, from argo/schema.json."""
    from jsonschema import Draft202012Validator

    bundle = _strict_definitions("argo/schema.json")
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
    ("trainer.kubeflow.org", "TrainJob"): "kubeflow-trainer/trainer.kubeflow.org_trainjobs.yaml",
    ("slinky.slurm.net", "NodeSet"): "slinky/slinky.slurm.net_nodesets.yaml",
    ("slinky.slurm.net", "RestApi"): "slinky/slinky.slurm.net_restapis.yaml",
    ("slinky.slurm.net", "Token"): "slinky/slinky.slurm.net_tokens.yaml",
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
            cache[key] = Draft202012Validator(_crd_schema(CRDS[(group, manifest["kind"])], version))
        return cache[key]

    return validator


@pytest.fixture(scope="session")
def swagger_validator():
    """Strict validator for an Argo Server REST API body definition, from argo/swagger.json."""
    from jsonschema import Draft202012Validator

    defs = _strict_definitions("argo/swagger.json")["definitions"]

    def validator(name: str) -> Draft202012Validator:
        return Draft202012Validator({"$ref": f"#/definitions/{name}", "definitions": defs})

    return validator


@pytest.fixture(scope="session")
def kueue_validator():
    """Strict validator for a Kueue object, from its CRD and the version in its apiVersion."""
    from jsonschema import Draft202012Validator

    files = {
        "ResourceFlavor": "resourceflavors",
        "ClusterQueue": "clusterqueues",
        "LocalQueue": "localqueues",
        "Topology": "topologies",
    }

    def validator(manifest) -> Draft202012Validator:
        name = f"kueue/kueue.x-k8s.io_{files[manifest['kind']]}.yaml"
        return Draft202012Validator(_crd_schema(name, manifest["apiVersion"].split("/")[1]))

    return validator
