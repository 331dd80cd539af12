"""A fan-out with `parallelism=` loops inside a DAG of its own, `<name>-all`, which Argo limits: what it renders."""

import pytest
from pydantic import BaseModel

from eksflow import PipelineError, task
from eksflow.refs import Item, Ref
from tests.unit.test_pipeline import MakeArgs, build, dag, step, template, use


class ListOutputs(BaseModel):
    names: list[str]
    path: str


lister = step("lister", MakeArgs, ListOutputs)


def fanned(parallelism: int | None, listed: bool) -> dict:
    """A fan-out over a task's list output (withParam) or a literal list (withItems), reading a task output too."""

    def body(p):
        made = task(lister, out_dir="/x")

        def candidate(item: Item) -> dict[str, Ref]:
            return {"score": task(use, path=made.path, note=item.value).score}

        items = made.names if listed else ["a", "b"]
        found = p.fan_out(candidate, items, parallelism=parallelism)
        task(use, task_name="best", path="p", scores=found.score)

    return build(body)


BODY_ARGUMENTS = [
    {"name": "lister_path", "value": "{{inputs.parameters.lister_path}}"},
    {"name": "item", "value": "{{item}}"},
]
SCORE = [{"name": "score", "valueFrom": {"parameter": "{{tasks.use.outputs.parameters.score}}"}}]


@pytest.mark.parametrize("listed", [False, True], ids=["withItems", "withParam"])
def test_without_parallelism_the_fan_out_task_loops_over_the_body(listed):
    rendered = fanned(None, listed)
    looped = dag(rendered)["candidate"]
    assert looped["template"] == "candidate"
    assert looped["arguments"]["parameters"] == [
        {"name": "lister_path", "value": "{{tasks.lister.outputs.parameters.path}}"},
        {"name": "item", "value": "{{item}}"},
    ]
    assert looped["depends"] == "lister.Succeeded"
    assert looped.get("withParam") == ("{{tasks.lister.outputs.parameters.names}}" if listed else None)
    assert looped.get("withItems") == (None if listed else ["a", "b"])
    body = template(rendered, "candidate")
    assert [i["name"] for i in body["inputs"]["parameters"]] == ["lister_path", "item"]
    assert body["outputs"]["parameters"] == SCORE
    assert "candidate-all" not in {t["name"] for t in rendered["spec"]["templates"]}


@pytest.mark.parametrize("listed", [False, True], ids=["withItems", "withParam"])
def test_with_parallelism_the_loop_sits_in_a_wrapper_dag_that_forwards_its_inputs(listed):
    rendered = fanned(2, listed)
    outer = dag(rendered)["candidate"]
    items = [{"name": "fan_out_items", "value": "{{tasks.lister.outputs.parameters.names}}"}] if listed else []
    assert outer["template"] == "candidate-all"
    assert outer["arguments"]["parameters"] == [
        {"name": "lister_path", "value": "{{tasks.lister.outputs.parameters.path}}"},
        *items,
    ]
    assert outer["depends"] == "lister.Succeeded"
    assert "withParam" not in outer and "withItems" not in outer
    wrapper = template(rendered, "candidate-all")
    assert wrapper["parallelism"] == 2
    assert [i["name"] for i in wrapper["inputs"]["parameters"]] == ["lister_path", *(i["name"] for i in items)]
    assert wrapper["outputs"]["parameters"] == [
        {"name": "score", "valueFrom": {"parameter": "{{tasks.candidate.outputs.parameters.score}}"}}
    ]
    [looped] = wrapper["dag"]["tasks"]
    assert looped["template"] == "candidate" and "depends" not in looped
    assert looped["arguments"]["parameters"] == BODY_ARGUMENTS
    assert looped.get("withParam") == ("{{inputs.parameters.fan_out_items}}" if listed else None)
    assert looped.get("withItems") == (None if listed else ["a", "b"])
    assert template(rendered, "candidate")["outputs"]["parameters"] == SCORE
    assert dag(rendered)["best"]["depends"] == "candidate.Succeeded"


def test_the_wrappers_name_is_taken_like_a_tasks():
    def body(p):
        task(use, task_name="each-all", path="p")
        p.fan_out(lambda item: {"s": task(use, path=item.value).score}, ["a"], task_name="each", parallelism=1)

    with pytest.raises(PipelineError, match="task name 'each-all' is used twice"):
        build(body)
