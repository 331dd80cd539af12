"""The manifest model: what parse_manifest accepts (nested DAGs, fan-out, memoize), and what it refuses up front."""

from pathlib import Path
from typing import Any

import pytest

from eksflow.local import LocalExecutorError
from eksflow.local.manifest import parse_manifest
from eksflow.local.model import ContainerTemplate, DagTemplate, Loop
from tests.unit.local.manifests import APPEND, container, dag, inputs, lines, params, phases, run, task, workflow


def nested() -> dict[str, Any]:
    inner = dag(
        "inner",
        [task("a", "ok"), task("b", "ok", "a.Failed || a.Succeeded"), task("c", "ok", "a")],
        inputs=inputs("x"),
        parallelism=2,
        outputs={"parameters": [{"name": "y", "valueFrom": {"parameter": "{{tasks.a.status}}"}}]},
    )
    return workflow(
        [task("fan", "inner", arguments=params(x="{{item}}"), withItems=[1, {"k": "v"}]), task("after", "ok", "fan")],
        [container("ok", "pass"), inner],
    )


def test_nested_dags_and_fan_out_are_parsed() -> None:
    parsed = parse_manifest(nested())
    inner = parsed.templates["inner"]
    assert isinstance(inner, DagTemplate)
    assert (inner.leaves, inner.handled, inner.parallelism) == (("b", "c"), frozenset({"a"}), 2)
    assert inner.outputs[0].parameter == "{{tasks.a.status}}"
    main = parsed.dag(parsed.entrypoint)
    assert main.tasks["fan"].loop == Loop((1, {"k": "v"}), None)
    assert isinstance(parsed.templates["ok"], ContainerTemplate)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda m: m["spec"]["templates"][1]["dag"]["tasks"].append(task("again", "inner")),
            r"DAG templates run each other in a loop \(inner -> inner\)",
        ),
        (
            lambda m: m["spec"]["templates"][1]["outputs"]["parameters"][0].update(valueFrom={"expression": "1"}),
            r"valueFrom.expression is not supported locally; use valueFrom.parameter",
        ),
        (
            lambda m: m["spec"]["templates"][1]["outputs"]["parameters"][0].update(
                valueFrom={"parameter": "x {{tasks.a.status}}"}
            ),
            r"valueFrom.parameter must be one reference",
        ),
        (
            lambda m: m["spec"]["templates"][1].update(retryStrategy={"limit": 1}),
            r"spec.templates\[1\].retryStrategy is not supported locally",
        ),
        (lambda m: m["spec"]["templates"][2]["dag"]["tasks"][0].update(withItems="a"), r"withItems must be a list"),
        (lambda m: m["spec"]["templates"][2]["dag"]["tasks"][0].update(withItems=[None]), r"withItems\[0\] is empty"),
        (
            lambda m: m["spec"]["templates"][2]["dag"]["tasks"].append(
                task("late", "ok", withParam="{{tasks.after.outputs.parameters.x}}")
            ),
            r"task 'late' reads tasks.after but does not depend on 'after'",
        ),
        (lambda m: m["spec"].update(entrypoint="ok"), r"spec.entrypoint 'ok' must be a dag template locally"),
    ],
    ids=[
        "recursion",
        "output-expression",
        "output-not-a-reference",
        "dag-retry",
        "items-not-list",
        "empty-item",
        "undeclared-loop-dependency",
        "container-entrypoint",
    ],
)
def test_unsupported_shapes_are_refused_naming_the_field(mutate: Any, message: str) -> None:
    manifest = nested()
    mutate(manifest)
    with pytest.raises(LocalExecutorError, match=message):
        parse_manifest(manifest)


def test_a_dag_exit_handler_runs_as_the_onexit_node_with_the_workflow_status(tmp_path: Path) -> None:
    status = tmp_path / "status"
    handler = dag("cleanup", [task("report", "report"), task("notify", "report", "report")])
    manifest = workflow(
        [task("boom", "boom")],
        [
            container("boom", "import sys; sys.exit(3)"),
            container("report", APPEND, str(status), "{{workflow.status}}"),
            handler,
        ],
        onExit="cleanup",
    )
    result = run(manifest, tmp_path)
    assert phases(result) == {
        "boom": "Failed",
        "onExit": "Succeeded",
        "onExit.report": "Succeeded",
        "onExit.notify": "Succeeded",
    }
    assert result.nodes["onExit.report"].parent == "onExit"
    assert lines(status) == ["Failed", "Failed"]
    assert result.phase == "Failed" and result.message.startswith("child 'boom' failed: exit code 3")
