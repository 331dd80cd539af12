"""The rendered Slurm task against eksflow.runtime.slurm_job: its own arguments parse, and name what the job gets.

The container's env entries carry the values (the profile's and the pipeline's `env`); `--forward-env` names them,
so the job's ranks get exactly those; `--workflow-uid` is Argo's `{{workflow.uid}}`, the job's comment.
"""

import json

import pytest

from eksflow.errors import PipelineError
from eksflow.runtime.slurm_job import JobArgs
from tests.flagship import rendered

P4D_SLURM = [
    "cluster.instance_type=p4d.24xlarge",
    "cluster.nodes=2",
    "cluster.zone=us-west-2a",
    "cluster.launcher=slurm",
]
UID = "5f0c6a8e-2b1d-4c3e-9a7f-0123456789ab"


def slurm_container(overrides):
    (template,) = [t for t in rendered(overrides)["spec"]["templates"] if t["name"] == "train"]
    return template["container"]


def test_the_task_names_its_containers_env_for_the_job_and_passes_the_workflow_uid():
    container = slurm_container([*P4D_SLURM, "env.WANDB_PROJECT=llama-lora-demo"])
    args = container["args"]
    own = args[: args.index("--")]
    assert "--workflow-uid={{workflow.uid}}" in own
    (forward,) = [a for a in own if a.startswith("--forward-env=")]
    names = json.loads(forward.partition("=")[2])
    env = {e["name"]: e["value"] for e in container["env"]}
    assert names == list(env)  # every variable the container gets, no other, each once
    assert {"WANDB_PROJECT", "HF_HUB_OFFLINE", "FI_PROVIDER", "NCCL_PROTO"} <= set(names)
    assert env["WANDB_PROJECT"] == "llama-lora-demo"
    assert not [a for a in args if "llama-lora-demo" in a]  # values travel in env entries, never in argv
    # slurm_job takes these arguments as rendered once Argo has substituted the workflow's name and uid
    substituted = [a.replace("{{workflow.name}}", "llama-lora-x7k2").replace("{{workflow.uid}}", UID) for a in own]
    parsed = JobArgs.from_argv(substituted)
    assert parsed.forward_env == names and parsed.workflow_uid == UID


@pytest.mark.parametrize("secret", ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN"])
def test_a_credential_in_the_pipelines_env_is_refused_naming_it(secret):
    with pytest.raises(PipelineError, match=rf"^env\.{secret}: cluster.launcher=slurm .* only from a Secret"):
        slurm_container([*P4D_SLURM, f"env.{secret}=x1y2z3"])
