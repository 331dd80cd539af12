"""Each wire written once: sections shared by tasks, resource templates from manifests, pod options, step gauges."""

import types
from dataclasses import dataclass

import pytest
from pydantic import BaseModel, Field

from eksflow import Pipeline, PipelineConfig, PipelineError, Ref, Section, Settings, StepArgs, resource, task
from eksflow.render import manifest


def step(name: str, args: type[StepArgs], outputs: type[BaseModel], **contract: object) -> types.ModuleType:
    module = types.ModuleType(f"mysteps.{name}")
    module.Args = args  # type: ignore[attr-defined]
    module.Outputs = outputs  # type: ignore[attr-defined]
    for key, value in contract.items():
        setattr(module, key, value)
    return module


@dataclass(frozen=True)
class Tracking(Section):
    tracking_uri: str
    ui_url: str = ""
    model_name: str = "demo"


@dataclass(frozen=True)
class Model(Section):
    base_model: Ref | str
    cache_dir: str = "/fsx/models"


class TrainSettings(Settings):
    steps: int = Field(10, ge=1)


class TrainArgs(TrainSettings, StepArgs):
    tracking_uri: str = ""
    base_model: str
    cache_dir: str = "/cache"


class ReportArgs(StepArgs):
    tracking_uri: str = ""
    ui_url: str = ""


class Done(BaseModel):
    loss: float
    note: str


train = step("train", TrainArgs, Done, GAUGES={"loss": "the last loss"})
report = step("report", ReportArgs, Done)


def build(body) -> dict:
    with Pipeline(PipelineConfig(name="t"), title="test", parameters={"base_model": "tiny"}) as p:
        body(p)
    return manifest(p)


def template(rendered: dict, name: str) -> dict:
    return next(t for t in rendered["spec"]["templates"] if t["name"] == name)


def args_of(rendered: dict, name: str) -> list[str]:
    return template(rendered, name)["container"]["args"]


def test_each_task_takes_the_fields_of_a_shared_section_its_step_declares():
    tracking = Tracking("sqlite:////fsx/mlflow.db", ui_url="http://mlflow")

    def body(p):
        model = Model(p.parameters.base_model)
        task(train, TrainSettings(steps=3), tracking, model)
        task(report, tracking)

    rendered = build(body)
    assert args_of(rendered, "train") == [
        "--steps=3",
        "--tracking-uri=sqlite:////fsx/mlflow.db",
        "--base-model={{workflow.parameters.base_model}}",
        "--cache-dir=/fsx/models",
        "--outputs-dir=/tmp/outputs",
    ]
    assert args_of(rendered, "report") == [
        "--tracking-uri=sqlite:////fsx/mlflow.db",
        "--ui-url=http://mlflow",
        "--outputs-dir=/tmp/outputs",
    ]


def test_a_keyword_wins_over_a_section():
    rendered = build(lambda p: task(train, TrainSettings(), Model("tiny"), base_model="other", steps=5))
    assert "--base-model=other" in args_of(rendered, "train")
    assert "--steps=5" in args_of(rendered, "train")


def test_a_section_the_step_takes_nothing_of_is_refused():
    with pytest.raises(PipelineError, match=r"takes nothing of section Model \(its fields: base_model, cache_dir\)"):
        build(lambda p: task(report, Model("tiny")))


def test_a_field_two_sections_give_is_refused():
    @dataclass(frozen=True)
    class Other(Section):
        tracking_uri: str

    with pytest.raises(PipelineError, match="tracking_uri is given by both Tracking and Other"):
        build(lambda p: task(report, Tracking("a"), Other("b")))


def test_a_shared_section_value_is_checked_against_the_step_field():
    class Bounded(StepArgs):
        steps: int = Field(1, ge=1)

    @dataclass(frozen=True)
    class Steps(Section):
        steps: int

    with pytest.raises(PipelineError, match="argument steps=0"):
        build(lambda p: task(step("bounded", Bounded, Done), Steps(0)))


def test_something_that_is_not_a_section_is_refused_with_the_fix():
    with pytest.raises(PipelineError, match="is not a section: give a config section"):
        build(lambda p: task(report, {"tracking_uri": "x"}))


def test_a_config_section_must_be_the_steps_own():
    class Foreign(Settings):
        colour: str = "red"

    with pytest.raises(PipelineError, match="no argument colour"):
        build(lambda p: task(report, Foreign()))


def test_step_gauges_come_from_its_contract_under_the_task_name():
    rendered = build(lambda p: task(train, TrainSettings(), base_model="tiny", task_name="fit"))
    gauges = template(rendered, "fit")["metrics"]["prometheus"]
    assert [(g["name"], g["gauge"]["value"], g["help"]) for g in gauges] == [
        ("eksflow_fit_loss", "{{outputs.parameters.loss}}", "the last loss")
    ]


def test_a_gauge_on_an_output_the_step_lacks_is_refused():
    wrong = step("wrong", ReportArgs, Done, GAUGES={"accuracy": "?"})
    with pytest.raises(PipelineError, match=r"mysteps.wrong.GAUGES names accuracy, which are not among its Outputs"):
        build(lambda p: task(wrong))


def test_pod_options_label_annotate_place_and_mount_secrets_read_only():
    def body(p):
        task(
            report,
            labels={"team": "ml"},
            annotations={"note": "x"},
            node_selector={"pool": "cpu"},
            secrets={"/etc/keys": "serving-keys"},
        )

    rendered = template(build(body), "report")
    assert rendered["metadata"]["labels"] == {"team": "ml"}
    assert rendered["metadata"]["annotations"] == {"eksflow.dev/path-args": "--outputs-dir", "note": "x"}
    assert rendered["nodeSelector"] == {"pool": "cpu"}
    assert rendered["volumes"] == [
        {"name": "serving-keys", "secret": {"secretName": "serving-keys", "defaultMode": 0o440}}
    ]
    assert rendered["container"]["volumeMounts"][-1] == {
        "name": "serving-keys",
        "mountPath": "/etc/keys",
        "readOnly": True,
    }


def test_a_resource_manifest_reading_task_outputs_gets_them_as_inputs_and_depends_on_their_task():
    def body(p):
        made = task(report)
        resource(
            "config",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"{made.note}-config", "labels": {"run": str(p.workflow_name)}},
                "data": {"loss": made.loss},
            },
            action="apply",
            owned=False,
        )

    rendered = build(body)
    created = template(rendered, "config")
    assert [i["name"] for i in created["inputs"]["parameters"]] == ["note", "loss"]
    text = created["resource"]["manifest"]
    assert '{{=toJson(inputs.parameters.note + "-config")}}' in text
    assert "{{workflow.name}}" in text  # a name Argo generates stays a plain tag
    assert "tasks." not in text
    assert created["resource"]["action"] == "apply"
    assert "setOwnerReference" not in created["resource"]
    main = next(t for t in rendered["spec"]["templates"] if t["name"] == "main")
    wired = next(t for t in main["dag"]["tasks"] if t["name"] == "config")
    assert wired["depends"] == "report.Succeeded"
    assert wired["arguments"]["parameters"] == [
        {"name": "note", "value": "{{tasks.report.outputs.parameters.note}}"},
        {"name": "loss", "value": "{{tasks.report.outputs.parameters.loss}}"},
    ]


def test_a_resource_manifest_reading_an_undeclared_input_is_refused():
    with pytest.raises(PipelineError, match=r"resource 'job': the manifest reads \{\{inputs.parameters.x\}\}"):
        build(lambda p: resource("job", {"kind": "Job", "metadata": {"name": "{{inputs.parameters.x}}"}}))


def test_a_resource_manifest_reading_a_task_output_typed_in_by_hand_is_refused():
    """Only a Ref formatted into the string is wired (tests/unit/test_resource_refs.py): this text never was one."""
    with pytest.raises(PipelineError, match=r"resource 'job': the manifest reads \{\{tasks.later.outputs.parameters.x"):
        build(lambda p: resource("job", {"kind": "Job", "metadata": {"name": "{{tasks.later.outputs.parameters.x}}"}}))
