"""What a user's own project renders (tests/fixtures/greeter) is a valid Argo Workflow, in every kind."""

import subprocess
import sys
from pathlib import Path

import yaml

from tests.contract.test_rendered import errors

PROJECT = Path(__file__).resolve().parents[1] / "fixtures" / "greeter"


def render(*args: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.hello", "render", *args],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        check=True,
    )
    return list(yaml.safe_load_all(done.stdout))


def test_the_user_pipeline_renders_valid_workflows(argo_validator):
    (workflow,) = render()
    assert errors(argo_validator("Workflow"), workflow) == []
    template, cron = render("--kind", "CronWorkflow", "--cron", "*/30 * * * *")
    assert errors(argo_validator("WorkflowTemplate"), template) == []
    assert errors(argo_validator("CronWorkflow"), cron) == []
    commands = {t["name"]: t["container"]["command"] for t in workflow["spec"]["templates"] if "container" in t}
    assert commands == {
        "greet-en": ["python", "-m", "steps.greet"],
        "greet-fr": ["python", "-m", "steps.greet"],
        "combine": ["python", "-m", "steps.combine"],
    }
