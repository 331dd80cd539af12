"""Validators built once per session from the official schemas in ../shared/schemas (see its README)."""

import json
from pathlib import Path

import pytest

SCHEMAS = Path(__file__).resolve().parents[2].parent / "shared" / "schemas"


@pytest.fixture(scope="session")
def argo_validator():
    """Strict (unknown fields rejected) validator factory for an Argo kind, from argo/schema.json."""
    path = SCHEMAS / "argo" / "schema.json"
    if not path.is_file():
        pytest.skip(f"official Argo schema not found at {path} (the shared/ folder sits beside the repo in CI)")
    from jsonschema import Draft202012Validator

    bundle = json.loads(path.read_text())
    defs = bundle["definitions"]
    # The file renders IntOrString and Quantity as plain strings; the API server accepts numbers for both.
    defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["integer", "string"]}
    defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {"type": ["integer", "number", "string"]}
    for definition in defs.values():  # kubectl --validate=strict: a misspelled field is an error
        if definition.get("type") == "object" and "properties" in definition:
            definition.setdefault("additionalProperties", False)

    def validator(kind: str) -> Draft202012Validator:
        return Draft202012Validator(
            {
                "$schema": bundle["$schema"],
                "$ref": f"#/definitions/io.argoproj.workflow.v1alpha1.{kind}",
                "definitions": defs,
            }
        )

    return validator
