"""Every pipeline in pipelines/ renders valid Argo objects in every kind, and the committed templates match."""

import importlib
from pathlib import Path

import pytest
import yaml

from eksflow.config import config_type, load_config
from eksflow.render import cron_workflow, manifest, workflow_template
from tests.contract.test_rendered import errors

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = sorted(p.stem for p in (ROOT / "pipelines").glob("*.py") if not p.stem.startswith("_"))
# what `make templates` writes: every pipeline's WorkflowTemplate, and a CronWorkflow for the scheduled ones
SCHEDULES = {"llama_lora": "0 3 * * 1", "champion_check": "0 6 * * *"}


def built(name: str, overrides=()):
    module = importlib.import_module(f"pipelines.{name}")
    return module.build(load_config(config_type(module.build), None, overrides))


@pytest.mark.parametrize("name", PIPELINES)
def test_every_kind_validates(name, argo_validator):
    pipeline = built(name)
    workflow = manifest(pipeline)
    assert errors(argo_validator("Workflow"), workflow) == []
    assert errors(argo_validator("WorkflowTemplate"), workflow_template(workflow)) == []
    cron = cron_workflow(workflow, "0 3 * * 1", "UTC", pipeline.scheduled)
    assert errors(argo_validator("CronWorkflow"), cron) == []


@pytest.mark.parametrize("name", PIPELINES)
def test_committed_templates_match_a_fresh_render(name):
    pipeline = built(name)
    workflow = manifest(pipeline)
    kebab = name.replace("_", "-")
    committed = ROOT / "workflow-templates" / f"{kebab}.yaml"
    assert committed.is_file(), "run `make templates` and commit workflow-templates/"
    assert yaml.safe_load(committed.read_text()) == workflow_template(workflow), "stale: run `make templates`"
    if name in SCHEDULES:
        documents = list(yaml.safe_load_all((ROOT / "workflow-templates" / f"{kebab}-cron.yaml").read_text()))
        expected = cron_workflow(workflow, SCHEDULES[name], "UTC", pipeline.scheduled)
        assert documents == [workflow_template(workflow), expected], "stale: run `make templates`"


def test_the_sweep_fans_out_one_candidate_per_grid_point():
    workflow = manifest(built("lora_sweep", ["sweep.ranks=[4,8]", "sweep.learning_rates=[0.001,0.002]"]))
    templates = {t["name"]: t for t in workflow["spec"]["templates"]}
    (outer,) = [t for t in templates["main"]["dag"]["tasks"] if t["name"] == "candidate"]
    assert outer["template"] == "candidate-all"  # a wrapper DAG holds the loop: its parallelism limits iterations
    assert templates["candidate-all"]["parallelism"] == 1
    (fan,) = templates["candidate-all"]["dag"]["tasks"]
    assert [item["name"] for item in fan["withItems"]] == ["r4-lr0.001", "r4-lr0.002", "r8-lr0.001", "r8-lr0.002"]
    inner = {t["name"]: t for t in templates["candidate"]["dag"]["tasks"]}
    assert sorted(inner) == ["evaluate", "train"]
    assert inner["evaluate"]["depends"] == "train.Succeeded"
    train_args = templates["train"]["container"]["args"]
    assert "--lora={{inputs.parameters.lora}}" in train_args
    assert "--output-dir={{inputs.parameters.output_dir}}" in train_args
    register = next(t for t in templates["main"]["dag"]["tasks"] if t["name"] == "register")
    assert register["when"] == "{{tasks.select-best.outputs.parameters.found}} == true"


def test_the_champion_check_alerts_only_on_regression():
    workflow = manifest(built("champion_check"))
    tasks = {t["name"]: t for t in workflow["spec"]["templates"][0]["dag"]["tasks"]}
    assert tasks["alert"]["when"] == "{{tasks.record-check.outputs.parameters.regressed}} == true"
    alert = next(t for t in workflow["spec"]["templates"] if t["name"] == "alert")
    assert alert["retryStrategy"]["limit"] == "0"
