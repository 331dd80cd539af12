"""A skipped task says why in its pipeline's words: `when=staged.changed.otherwise(staged.reason)`.

A skipped train read `when '(false == true) && (1.0 >= 0.95)' evaluated to false` (issue 55). The reason travels
beside the expression as an annotation of the task's template (eksflow.runtime.skip_reason): the local executor
gives it as the node's message, and the report finds it in a cluster's Workflow, where Argo's message is the
expression.
"""

import pytest
from pydantic import BaseModel

from eksflow import Pipeline, PipelineConfig, PipelineError, StepArgs, task
from eksflow.llm.steps.report.collect import collect
from eksflow.llm.steps.stage_data.step import change_reason
from eksflow.render import manifest
from eksflow.runtime.skip_reason import REASON, REASON_OUTPUT
from tests.flagship import rendered
from tests.unit.local.manifests import WRITE_OUTPUT, container, outputs, run, workflow
from tests.unit.local.manifests import task as manifest_task
from tests.unit.test_pipeline import MakeArgs, step


class CheckOutputs(BaseModel):
    changed: bool
    reason: str
    score: float


check = step("check", MakeArgs, CheckOutputs)
use = step("use", type("UseArgs", (StepArgs,), {"__annotations__": {"note": str}, "note": ""}), CheckOutputs)


def template(rendered_manifest: dict, name: str) -> dict:
    return next(t for t in rendered_manifest["spec"]["templates"] if t["name"] == name)


def test_a_reason_given_as_an_output_or_as_text_travels_beside_the_expression():
    with Pipeline(PipelineConfig(name="t"), title="t") as p:
        checked = task(check, out_dir="/fsx/x")
        task(use, task_name="by-output", when=checked.changed.otherwise(checked.reason))
        task(use, task_name="by-text", when=(checked.score >= 0.9).otherwise("the score is under 0.9"))
        task(use, task_name="plain", when=checked.changed)
    rendered_manifest = manifest(p)
    by_output, by_text = template(rendered_manifest, "by-output"), template(rendered_manifest, "by-text")
    assert by_output["metadata"]["annotations"][REASON_OUTPUT] == "check.reason"
    assert by_text["metadata"]["annotations"][REASON] == "the score is under 0.9"
    plain = template(rendered_manifest, "plain")["metadata"]["annotations"]
    assert REASON not in plain and REASON_OUTPUT not in plain and REASON not in by_output["metadata"]["annotations"]
    tasks = {t["name"]: t for t in template(rendered_manifest, "main")["dag"]["tasks"]}
    assert tasks["by-output"]["when"] == "{{tasks.check.outputs.parameters.changed}} == true"  # no reason inside
    assert tasks["by-output"]["depends"] == "check.Succeeded"


@pytest.mark.parametrize(
    ("when", "refused"),
    [
        (lambda c: c.changed.otherwise("x") & c.changed, "give it once, last"),
        (lambda c: ~c.changed.otherwise("x"), "give it once, last"),
        (lambda c: c.changed.otherwise(c.score), "is float, not text"),
        (lambda c: c.changed.otherwise("   "), "the reason is empty"),
        (lambda c: c.changed.otherwise("{{workflow.name}}"), "holds '{{'"),
    ],
    ids=["combined-after", "negated-after", "a-number", "blank", "an-expression"],
)
def test_a_reason_that_cannot_say_why_is_refused_when_the_pipeline_is_built(when, refused):
    with Pipeline(PipelineConfig(name="t"), title="t"), pytest.raises(PipelineError, match=refused):
        checked = task(check, out_dir="/fsx/x")
        task(use, when=when(checked))


def test_the_local_executor_says_the_pipeline_s_reason_for_a_skipped_task(tmp_path):
    reason = "data unchanged since champion v1 (sha256:1a2b3c4d5e6f)"
    code = f"{WRITE_OUTPUT}; open(os.path.join(os.path.dirname(sys.argv[1]), 'reason'), 'w').write({reason!r})"
    skipped = container("train", "pass")
    skipped["metadata"] = {"annotations": {REASON_OUTPUT: "stage.reason"}}
    result = run(
        workflow(
            [
                manifest_task("stage", "stage"),
                manifest_task("train", "train", "stage", when="{{tasks.stage.outputs.parameters.changed}} == true"),
                manifest_task("other", "other", "stage", when="{{tasks.stage.outputs.parameters.changed}} == true"),
            ],
            [
                container("stage", code, "/tmp/outputs/changed", "false", outputs=outputs("changed", "reason")),
                skipped,
                container("other", "pass"),
            ],
        ),
        tmp_path,
    )
    assert result.nodes["train"].phase == "Skipped" and result.nodes["train"].message == reason
    assert result.nodes["other"].message == "when 'false == true' evaluated to false"  # no reason given


def test_the_report_reads_the_reason_of_a_cluster_s_skipped_task_from_its_workflow():
    """Argo's node message is the expression; the template's annotation and the producer's outputs say why."""
    workflow_object = {
        "metadata": {"name": "wf"},
        "spec": {
            "entrypoint": "main",
            "templates": [
                {"name": "main", "dag": {"tasks": [
                    {"name": "stage", "template": "stage"},
                    {"name": "train", "template": "train", "depends": "stage"},
                ]}},
                {"name": "stage", "container": {"image": "i"}},
                {"name": "train", "container": {"image": "i"},
                 "metadata": {"annotations": {REASON_OUTPUT: "stage.reason"}}},
            ],
        },
        "status": {
            "nodes": {
                "wf-1": {"displayName": "stage", "boundaryID": "wf", "phase": "Succeeded",
                         "outputs": {"parameters": [{"name": "reason", "value": "data unchanged since champion v1"}]}},
                "wf-2": {"displayName": "train", "boundaryID": "wf", "phase": "Skipped",
                         "message": "when 'false == true' evaluated false"},
            }
        },
    }  # fmt: skip
    tasks = {t.name: t for t in collect(workflow_object).tasks}
    assert tasks["train"].message == "data unchanged since champion v1"


def test_stage_data_says_whether_the_data_changed_naming_the_champion():
    digest = "sha256:" + "1a2b3c4d5e6f" * 5
    assert change_reason(digest, digest, "1") == "data unchanged since champion v1 (sha256:1a2b3c4d5e6f)"
    assert change_reason(digest, "sha256:" + "0" * 60, "3") == "data changed since champion v3"
    assert change_reason(digest, "", "") == "no earlier training data to compare with"


def test_the_flagship_s_train_and_fleet_say_the_data_is_unchanged_when_skipped():
    templates = {t["name"]: t for t in rendered()["spec"]["templates"]}
    assert templates["train"]["metadata"]["annotations"][REASON_OUTPUT] == "stage-data.reason"
    assert templates["prepare-fleet"]["metadata"]["annotations"][REASON_OUTPUT] == "stage-data.reason"
