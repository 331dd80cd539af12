"""resource() keeps Refs typed: a task output in a manifest is wired as the Ref it is, never parsed back from text.

A Ref given as a whole value is wired directly (a joined path part by part); one formatted into a string
(`f"{fleet}-vllm"`, str()) is recorded on its task under its exact Argo text, and resource() wires the tags of
the string that are such texts of this pipeline's tasks. A `{{tasks...}}` typed in by hand was never a Ref's
text: refused, as every tag but workflow values, names Argo generates and declared `inputs=` is.
"""

import pytest

from eksflow import Pipeline, PipelineConfig, PipelineError, ended, resource, task
from eksflow.refs import Item, Ref
from tests.unit.test_pipeline import build, dag, make, template, use

PATH = "{{tasks.make.outputs.parameters.path}}"


def config_map(**data: object) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": data}


def wired(rendered: dict, name: str = "obj") -> tuple[list[str], str, dict[str, str], str | None]:
    """The resource's input parameters, its manifest text, the arguments its task passes and what it depends on."""
    made, wiring = template(rendered, name), dag(rendered)[name]
    inputs = [i["name"] for i in made.get("inputs", {}).get("parameters", [])]
    args = {a["name"]: a["value"] for a in wiring.get("arguments", {}).get("parameters", [])}
    return inputs, made["resource"]["manifest"], args, wiring.get("depends")


def test_a_ref_given_as_a_whole_value_is_wired_as_an_input_and_a_dependency():
    def body(p):
        made = task(make, out_dir="/x")
        resource("obj", config_map(path=made.path, name=p.workflow_name))

    inputs, text, args, depends = wired(build(body))
    assert inputs == ["path"]
    assert args == {"path": PATH}
    assert depends == "make.Succeeded"
    assert "path: {{=toJson(inputs.parameters.path)}}" in text
    assert "name: '{{workflow.name}}'" in text  # a workflow value given whole stays a plain tag
    assert "tasks." not in text


def test_a_ref_in_an_f_string_or_str_is_wired_where_its_text_stands():
    def body(p):
        made = task(make, out_dir="/x")
        fleet = made.path
        rows = str(made.rows)  # as eksflow.llm.serving.rollout hands task outputs to the object builders
        resource("obj", config_map(name=f"{fleet}-vllm", rows=f"{rows} rows", again=f"{made.path}"))

    inputs, text, args, _ = wired(build(body))
    assert inputs == ["path", "rows"]  # one input per output, in the manifest's order; the same output once
    assert args == {"path": PATH, "rows": "{{tasks.make.outputs.parameters.rows}}"}
    assert '{{=toJson(inputs.parameters.path + "-vllm")}}' in text
    assert '{{=toJson(inputs.parameters.rows + " rows")}}' in text
    assert "again: {{=toJson(inputs.parameters.path)}}" in text


def test_a_joined_path_is_wired_part_by_part_whole_or_formatted():
    def body(p):
        made = task(make, out_dir="/x")
        other = task(make, task_name="other", out_dir="/y")
        joined = p.run_dir / made.path / other.path / "x"
        resource("obj", config_map(whole=joined, text=f"--dir={joined}"))

    inputs, text, args, depends = wired(build(body))
    assert inputs == ["path", "other_path"]  # a second output named `path` takes its task's name
    assert args == {"path": PATH, "other_path": "{{tasks.other.outputs.parameters.path}}"}
    assert depends == "make.Succeeded && other.Succeeded"
    tail = 'runs/" + workflow.name + "/" + inputs.parameters.path + "/" + inputs.parameters.other_path + "/x")}}'
    assert f'whole: {{{{=toJson("/fsx/{tail}' in text
    assert f'text: {{{{=toJson("--dir=/fsx/{tail}' in text


def test_an_output_formatted_through_ended_waits_for_any_outcome_as_in_a_tasks_argument():
    def body(p):
        with p.on_exit():
            made = task(make, out_dir="/x")
            resource("obj", config_map(name=f"{ended(made).path}"))
            task(use, path=ended(made).path)

    rendered = build(body)
    assert [i["name"] for i in template(rendered, "obj")["inputs"]["parameters"]] == ["path"]
    tasks = dag(rendered, "exit-handler")
    anyhow = "(make.Succeeded || make.Skipped || make.Failed || make.Errored)"
    assert tasks["obj"]["depends"] == tasks["use"]["depends"] == anyhow


def test_a_declared_input_stays_a_tag_and_is_reused_for_the_same_output():
    def body(p):
        made = task(make, out_dir="/x")
        resource("obj", config_map(a="{{inputs.parameters.given}}", b=f"{made.path}"), inputs={"given": made.path})

    inputs, text, args, _ = wired(build(body))
    assert inputs == ["given"]
    assert args == {"given": PATH}
    assert "a: {{=toJson(inputs.parameters.given)}}" in text
    assert "b: {{=toJson(inputs.parameters.given)}}" in text


@pytest.mark.parametrize(
    "forged",
    [PATH, "{{ tasks.make.outputs.parameters.path }}", f"{PATH}-vllm", "{{inputs.parameters.path}}"],
    ids=["tag", "spaced", "in-text", "undeclared-input"],
)
def test_a_task_output_typed_in_by_hand_is_refused_though_the_task_exists(forged):
    def body(p):
        made = task(make, out_dir="/x")
        resource("obj", config_map(real=made.path, forged=forged))

    reference = forged.removesuffix("-vllm").strip("{} ")
    with pytest.raises(PipelineError) as refused:
        build(body)
    assert str(refused.value) == (
        f"resource 'obj': the manifest reads {{{{{reference}}}}}; give task outputs and workflow values themselves "
        "(or declare an input with inputs=)"
    )


def test_a_ref_of_another_pipeline_is_not_taken_for_this_ones():
    with Pipeline(PipelineConfig(name="a"), title="a"):
        elsewhere = task(make, out_dir="/x")
        text = f"{elsewhere.path}"  # recorded on the other pipeline's task
    with pytest.raises(PipelineError, match=r"reads make.path, an output of another pipeline's task"):
        build(lambda p: resource("obj", config_map(name=elsewhere.path)))
    for made_here in (False, True):  # a task of the same name here: its output was never formatted

        def body(p, made_here=made_here):
            if made_here:
                task(make, out_dir="/x")
            resource("obj", config_map(name=text))

        with pytest.raises(PipelineError, match=r"the manifest reads \{\{tasks.make.outputs.parameters.path\}\}"):
            build(body)


def fan_out_resource(value) -> dict:
    """A resource in a fan-out's body whose manifest reads `value(p, made, item)`, `made` a task outside it."""

    def body(p):
        made = task(make, out_dir="/x")

        def each(item: Item) -> dict[str, Ref]:
            resource("obj", config_map(name=value(p, made, item)))
            return {"score": task(use, path="p").score}

        p.fan_out(each, [{"name": "a"}, {"name": "b"}], task_name="each")

    return build(body)


ITEM_REFUSED = "resource 'obj': the manifest reads {}, a fan-out item, which a resource does not wire"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (lambda p, made, item: item.name, ITEM_REFUSED.format("item.name")),
        (lambda p, made, item: p.run_dir / item.name, ITEM_REFUSED.format("item.name")),
        (lambda p, made, item: f"{item.name}-x", "resource 'obj': the manifest reads {{item.name}}; give task outputs"),
    ],
    ids=["whole", "joined", "formatted"],
)
def test_a_fan_out_item_in_a_manifest_is_refused(value, message):
    """As before Refs were kept typed: a resource takes an item only as a declared input (inputs=)."""
    with pytest.raises(PipelineError) as refused:
        fan_out_resource(value)
    assert str(refused.value).startswith(message), refused.value


def test_a_task_output_read_in_a_fan_out_body_comes_in_as_the_bodys_input():
    rendered = fan_out_resource(lambda p, made, item: f"{made.path}-x")
    assert [i["name"] for i in template(rendered, "each")["inputs"]["parameters"]] == ["make_path"]
    assert dag(rendered, "each")["obj"]["arguments"]["parameters"] == [
        {"name": "path", "value": "{{inputs.parameters.make_path}}"}
    ]


def test_formatting_records_only_task_outputs_and_never_changes_the_text():
    with Pipeline(PipelineConfig(name="t"), title="test") as p:
        made = task(make, out_dir="/x")
        joined = p.run_dir / made.path
        assert f"{joined:>5}" == str(joined) == joined.argo
        assert f"{p.run_dir}" == "/fsx/runs/{{workflow.name}}"
    assert made._formatted == {PATH: joined.parts()[1]}  # the run folder is a workflow value: nothing to record
