"""The Slinky objects of `cluster.launcher: slurm`, strict against the slurm-operator's CRDs (vendored), and wired to
what the workflow's Slurm task expects: the partition it submits to, the Secret it mounts, the profile's devices."""

from pathlib import Path

import pytest
import yaml

from eksflow.launchers import slinky
from tests.flagship import config, rendered

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {
    "cpu": [],
    "p4d": ["cluster.instance_type=p4d.24xlarge", "cluster.nodes=2", "cluster.zone=us-west-2a", "cluster.spot=true"],
    "partition": ["cluster.instance_type=g5.12xlarge", "cluster.slurm.partition=gpu", "cluster.slurm.controller=hpc"],
}


def errors(validator, document):
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_slinky_object_validates_strictly(name, crd_validator):
    for obj in slinky.objects(config(CONFIGS[name])):
        assert errors(crd_validator(obj), obj) == [], obj["kind"]


def test_a_misspelled_nodeset_field_is_rejected(crd_validator):
    obj = slinky.nodeset(config())
    obj["spec"]["replica"] = 2
    assert errors(crd_validator(obj), obj)


def test_the_nodeset_is_the_partition_the_slurm_task_submits_to_with_the_profiles_devices():
    overrides = ["cluster.launcher=slurm", *CONFIGS["p4d"]]
    nodeset = slinky.nodeset(config(overrides))
    assert nodeset["metadata"]["name"] == "llama-lora-train" and nodeset["spec"]["replicas"] == 2
    assert nodeset["spec"]["partition"] == {"enabled": True, "config": "Default=YES"}  # the task names none
    resources = nodeset["spec"]["slurmd"]["resources"]["limits"]
    assert resources["nvidia.com/gpu"] == "8" and resources["vpc.amazonaws.com/efa"] == "4"
    pod = nodeset["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == "p4d.24xlarge"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in nodeset["spec"]["slurmd"]["volumeMounts"]
    (train,) = [t for t in rendered(overrides)["spec"]["templates"] if t["name"] == "train"]
    assert "--partition=" in train["container"]["args"]  # the cluster's default: this NodeSet's partition
    named = slinky.nodeset(config([*overrides, "cluster.slurm.partition=gpu"]))
    assert named["metadata"]["name"] == "gpu" and "config" not in named["spec"]["partition"]


def test_the_token_fills_the_secret_the_slurm_task_mounts():
    overrides = ["cluster.launcher=slurm", "cluster.slurm.token_secret=team-slurm", "cluster.slurm.user=mlops"]
    token = slinky.token(config(overrides))
    assert token["metadata"]["namespace"] == "argo"  # the workflow's, where the task mounts it
    assert token["spec"]["secretRef"] == {"name": "team-slurm", "key": "token"}
    assert token["spec"]["username"] == "mlops" and token["spec"]["refresh"] is True
    (train,) = [t for t in rendered(overrides)["spec"]["templates"] if t["name"] == "train"]
    assert train["volumes"] == [{"name": "team-slurm", "secret": {"secretName": "team-slurm", "defaultMode": 288}}]
    assert "--user=mlops" in train["container"]["args"]


def test_committed_slinky_objects_match_a_fresh_render():
    committed = ROOT / "workflow-templates" / "slinky.yaml"
    assert committed.is_file(), "run `make templates` and commit workflow-templates/"
    assert list(yaml.safe_load_all(committed.read_text())) == slinky.objects(config()), (
        "workflow-templates/slinky.yaml is stale: run `make templates`"
    )
