"""The rendered Workflow: valid against the official Argo schema, and every step's argv parses with its Args."""

import copy
import importlib
import re
import typing
from pathlib import Path

import pytest

from tests import flagship

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rendered():
    return flagship.rendered()


def dag_tasks(workflow):
    (dag,) = [t["dag"]["tasks"] for t in workflow["spec"]["templates"] if t["name"] == workflow["spec"]["entrypoint"]]
    return dag


def containers(workflow):
    return [t for t in workflow["spec"]["templates"] if "container" in t]


def errors(validator, document):
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def test_workflow_validates_against_the_official_schema(rendered, argo_validator):
    assert errors(argo_validator("Workflow"), rendered) == []


def test_a_misspelled_field_is_rejected(rendered, argo_validator):
    broken = copy.deepcopy(rendered)
    dag_tasks(broken)[1]["dependecies"] = ["stage-data"]
    assert any("dependecies" in e for e in errors(argo_validator("Workflow"), broken))


SAMPLE_OUTPUTS = {
    "model_version": "3",
    "mlflow_run_id": "0123abcd",
    "dataset_digest": "sha256:" + "0" * 64,
    "vllm_url": "http://llama-lora-vllm-0123abcd.argo.svc.cluster.local:8000",
    "fleet": "llama-lora-vllm-0123abcd",
    "evaluated_champion": "2",
    "champion_version": "2",
    "previous_version": "2",  # the champion's, for stage_data's reason
}


def sample(name, annotation) -> str:
    """A representative value of a wired field, as the upstream step writes it."""
    if name in SAMPLE_OUTPUTS:
        return SAMPLE_OUTPUTS[name]
    origin = typing.get_origin(annotation) or annotation
    return {dict: '{"exact_match": 0.5}', int: "1", float: "0.5", bool: "true"}.get(origin, "/fsx/runs/x/y")


@pytest.mark.parametrize(
    "module",
    [
        "stage_data",
        "validate_data",
        "train",
        "evaluate",
        "register",
        "prepare_fleet",
        "serve_champion",
        "load_candidate",
    ],
)
def test_template_args_parse_with_the_steps_args_model(rendered, module):
    step = importlib.import_module(f"eksflow.llm.steps.{module}")
    name = module.replace("_", "-")
    template = next(t for t in containers(rendered) if t["name"] == name)
    assert template["container"]["command"] == ["python", "-m", f"eksflow.llm.steps.{module}"]

    params = {p["name"]: p["value"] for p in rendered["spec"]["arguments"]["parameters"]}

    def resolve(arg: str) -> str:
        arg = re.sub(r"\{\{workflow\.parameters\.(\w+)\}\}", lambda m: params[m.group(1)], arg)
        arg = arg.replace("{{workflow.name}}", "llama-lora-x7k2p")
        return re.sub(
            r"\{\{inputs\.parameters\.(\w+)\}\}",
            lambda m: sample(m.group(1), step.Args.model_fields[m.group(1)].annotation),
            arg,
        )

    args = step.Args.from_argv([resolve(a) for a in template["container"]["args"]])
    assert args.outputs_dir == Path("/tmp/outputs")
    declared = [o["name"] for o in template["outputs"]["parameters"]]
    assert declared == list(step.Outputs.model_fields)
    assert all(o["valueFrom"]["path"] == f"/tmp/outputs/{o['name']}" for o in template["outputs"]["parameters"])


def test_gate_controls_register_and_the_rollout(rendered):
    tasks = {t["name"]: t for t in dag_tasks(rendered)}
    assert tasks["register"]["when"] == "{{tasks.evaluate.outputs.parameters.passed}} == true"
    assert {"register.Succeeded", "serve-champion.Succeeded"} <= set(tasks["load-candidate"]["depends"].split(" && "))


def test_evaluate_is_judged_against_the_runs_champion_which_is_in_its_memo_key(rendered):
    """A run after v2 became champion must not reuse an evaluation judged with no champion (or v1): the champion the
    run started with is an argument of evaluate and part of its memo key, and the rollout checks it is still so."""
    tasks = {t["name"]: t for t in dag_tasks(rendered)}
    template = next(t for t in containers(rendered) if t["name"] == "evaluate")
    champion = "{{tasks.champion.outputs.parameters.version}}"
    wired = {p["name"]: p["value"] for p in tasks["evaluate"]["arguments"]["parameters"]}
    assert wired["champion_version"] == champion
    assert "--champion-version={{inputs.parameters.champion_version}}" in template["container"]["args"]
    keyed_by = re.findall(r"\{\{inputs\.parameters\.(\w+)\}\}", template["memoize"]["key"])
    assert champion in [wired[name] for name in keyed_by], template["memoize"]["key"]
    loaded = {p["name"]: p["value"] for p in tasks["load-candidate"]["arguments"]["parameters"]}
    assert loaded["evaluated_champion"] == "{{tasks.evaluate.outputs.parameters.champion_version}}"


def test_no_parameter_reaches_a_shell(rendered):
    """S2: commands are argv lists (python -m ...), never `sh -c` with spliced parameters."""
    for template in containers(rendered):
        command = template["container"]["command"]
        assert command[:2] == ["python", "-m"]
        assert "script" not in template
