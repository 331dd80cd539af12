"""resource(..., action="delete"): the template Argo runs as `kubectl delete --ignore-not-found -f <manifest>`.

Rendered from a pipeline that applies a Deployment and later deletes it by the same wired name; the Workflow
validates strictly against Argo's official schema, and the local executor reads the same manifest.
"""

import pytest

from eksflow import PipelineError, resource, task
from eksflow.llm.serving import local_fleet  # noqa: F401  # registers the fleet's kinds with the local executor
from eksflow.local.manifest import parse_manifest
from tests.unit.test_pipeline import build, dag, make, template


def deployment(name: object) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}}


def named(p) -> None:
    made = task(make, out_dir="/x")
    applied = resource("up", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{made.path}-c"}})
    resource("down", deployment(f"{made.path}-vllm"), action="delete", after=applied)


def test_a_delete_renders_what_argo_takes_and_validates_against_its_schema(argo_validator):
    rendered = build(named)
    down = template(rendered, "down")
    assert down["resource"] == {
        "action": "delete",  # no setOwnerReference: a deleted object is given no owner
        "manifest": "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n"
        '  name: {{=toJson(inputs.parameters.path + "-vllm")}}\n',
    }
    assert dag(rendered)["down"]["depends"] == "make.Succeeded && up.Succeeded"
    assert [e.message for e in argo_validator("Workflow").iter_errors(rendered)] == []
    assert parse_manifest(rendered).templates["down"].action == "delete"


@pytest.mark.parametrize(
    ("manifest", "extra", "message"),
    [
        ({**deployment("x"), "spec": {"replicas": 1}}, {}, "metadata.name only; got spec too"),
        (
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "labels": {"a": "b"}}},
            {},
            "metadata.name only; got metadata.labels too",
        ),
        ({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {}}, {}, "metadata.name only; one is missing"),
        ({"kind": "Deployment", "metadata": {"name": "x"}}, {}, "metadata.name only; one is missing"),
        (deployment("x"), {"success": "status.readyReplicas > 0"}, "takes no success or failure condition"),
        (deployment("x"), {"failure": "status.failed > 0"}, "takes no success or failure condition"),
    ],
)
def test_what_a_delete_cannot_carry_is_refused_in_one_line_naming_the_task(manifest, extra, message):
    with pytest.raises(PipelineError, match=message) as caught:
        build(lambda p: resource("down", manifest, action="delete", **extra))
    assert str(caught.value).startswith("resource 'down': a delete ") and "\n" not in str(caught.value)
