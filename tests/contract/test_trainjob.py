"""The TrainJob launcher (cluster.launcher: trainjob): strict against Kubeflow Trainer v2.3.0's CRD (vendored), torchrun
of the step on every node with the profile's wiring through runtimePatches, and Argo following its conditions."""

import re

import pytest

from eksflow import plan
from eksflow.errors import ConfigError
from eksflow.launchers import trainjob
from eksflow.launchers.base import attempt_deadline_s
from tests.argo_substitution import manifest_object
from tests.contract.test_cluster_rendering import VARIANTS, errors, render, trainjob_pod
from tests.contract.test_mpijob import selector
from tests.flagship import config, pipeline

TRAINJOB_VARIANTS = sorted(name for name in VARIANTS if "trainjob" in name)
# What the Trainer's webhook takes as a patch's manager (validation.IsDomainPrefixedPath): <domain>/<path>.
DOMAIN_PREFIXED_PATH = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/[-A-Za-z0-9_./]+$")


def job_of(name):
    workflow = render(VARIANTS[name])
    (train,) = [t for t in workflow["spec"]["templates"] if t["name"] == "train"]
    return train, manifest_object(train)


def env_of(trainer):
    return {e["name"]: e["value"] for e in trainer["env"]}


@pytest.mark.parametrize("name", TRAINJOB_VARIANTS)
def test_every_trainjob_variant_validates_strictly(name, crd_validator):
    _, job = job_of(name)
    assert job["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and job["kind"] == "TrainJob"
    assert errors(crd_validator(job), job) == []


def test_a_misspelled_trainjob_field_is_rejected(crd_validator):
    _, job = job_of("cpu-trainjob")
    job["spec"]["trainer"]["numNode"] = job["spec"]["trainer"].pop("numNodes")
    assert any("numNode" in e for e in errors(crd_validator(job), job))


def test_gpu_trainjob_runs_torchrun_on_every_node_with_the_profiles_wiring():
    train, job = job_of("p4d-efa-spot-trainjob-rack")
    spec, trainer = job["spec"], job["spec"]["trainer"]
    assert trainer["command"] == ["torchrun", "-m", "eksflow.llm.steps.train"]  # a plain argv, no shell
    assert "--launcher=torchrun" in trainer["args"] and "--num-workers=16" in trainer["args"]
    assert "--use-gpu=true" in trainer["args"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 8  # a worker per GPU, 8 x 2 = 16
    env = env_of(trainer)
    assert not [name for name in env if name.startswith("PET_")]  # the Trainer's torch plugin sets (and refuses) them
    assert env["FI_PROVIDER"] == "efa" and env["NCCL_PROTO"] == "simple"
    limits = trainer["resourcesPerNode"]["limits"]
    assert limits["nvidia.com/gpu"] == "8" and limits["vpc.amazonaws.com/efa"] == "4"
    assert trainer["image"] == "ghcr.io/eksflow/train-gpu:0.1.0"
    assert spec["runtimeRef"] == {"name": "torch-distributed", "kind": "ClusterTrainingRuntime"}
    (patch,) = spec["runtimePatches"]
    assert DOMAIN_PREFIXED_PATH.match(patch["manager"]) and patch["manager"] != "kueue.x-k8s.io/manager"
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"  # torch-distributed's trainer job
    pod = trainjob_pod(job)
    assert pod["metadata"]["annotations"] == {
        "karpenter.sh/do-not-disrupt": "true",
        "kueue.x-k8s.io/podset-required-topology": "topology.k8s.aws/network-node-layer-3",
    }
    assert pod["spec"]["nodeSelector"]["topology.kubernetes.io/zone"] == "us-west-2a"
    assert pod["spec"]["nodeSelector"]["karpenter.sh/capacity-type"] == "spot"
    assert pod["spec"]["serviceAccountName"] == "eksflow-pipeline"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["fsx"]["persistentVolumeClaim"]["claimName"] == "fsx-claim"
    (container,) = pod["spec"]["containers"]
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/fsx", "/dev/shm"}
    (patched,) = node["template"]["spec"]["template"]["spec"]["containers"]
    assert "env" not in patched  # the Trainer's webhook refuses env for `node` in a patch: spec.trainer.env has it
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "eksflow" and spec["suspend"] is True
    assert spec["activeDeadlineSeconds"] == attempt_deadline_s(config(VARIANTS["p4d-efa-spot-trainjob-rack"]))
    assert train["resource"]["setOwnerReference"] is True


def test_cpu_trainjob_runs_one_worker_per_node_and_volcano_gets_the_queue_through_the_patch():
    _, one = job_of("cpu-trainjob")
    assert one["spec"]["trainer"]["numNodes"] == 1 and one["spec"]["trainer"]["numProcPerNode"] == 1
    assert "--num-workers=1" in one["spec"]["trainer"]["args"] and "--use-gpu=false" in one["spec"]["trainer"]["args"]
    _, several = job_of("cpu-trainjob-2-nodes-volcano")
    trainer = several["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 1 and "--num-workers=2" in trainer["args"]
    assert env_of(trainer)["GLOO_SOCKET_IFNAME"] == "eth0"  # gloo across the nodes' pods
    assert "suspend" not in several["spec"] and "kueue.x-k8s.io/queue-name" not in several["metadata"]["labels"]
    (patch,) = several["spec"]["runtimePatches"]
    metadata = patch["trainingRuntimeSpec"]["template"]["metadata"]
    assert metadata == {"annotations": {"scheduling.volcano.sh/queue-name": "eksflow"}}


def test_the_runtime_is_configurable_and_a_malformed_name_is_refused_in_one_line():
    overrides = [
        "cluster.launcher=trainjob",
        "cluster.trainjob.runtime=team-torch",
        "cluster.trainjob.runtime_kind=TrainingRuntime",
    ]
    (train,) = [t for t in render(overrides)["spec"]["templates"] if t["name"] == "train"]
    assert manifest_object(train)["spec"]["runtimeRef"] == {"name": "team-torch", "kind": "TrainingRuntime"}
    with pytest.raises(ConfigError) as refused:
        config(["cluster.launcher=trainjob", "cluster.trainjob.runtime=torch/distributed"])
    (line,) = str(refused.value).splitlines()
    assert line.startswith("cluster.trainjob.runtime:")


def test_a_pipeline_name_too_long_for_the_pods_hostnames_is_refused_in_one_line():
    longest_fitting = "a" * 35
    (train,) = [t for t in render(["cluster.launcher=trainjob", f"name={longest_fitting}", "cluster.nodes=2"])["spec"]
                ["templates"] if t["name"] == "train"]  # fmt: skip
    # The longest run name is a CronWorkflow's (10 digits of unix time); the TrainJob's last attempt and node pod:
    job = manifest_object(train)["metadata"]["name"]
    job = job.replace("{{workflow.name}}", f"{longest_fitting}-1765000000").replace("{{retries}}", "1")
    assert len(f"{job}-node-0-1") == 63
    for name, fix in (("a" * 36, "at most 35 characters"), ("9lives", "must start with a letter")):
        with pytest.raises(ConfigError) as refused:
            pipeline(["cluster.launcher=trainjob", f"name={name}", "cluster.nodes=2"])
        (line,) = str(refused.value).splitlines()
        assert fix in line


def test_plan_shows_the_pods_and_attempts_and_refuses_trainium_and_too_many_nodes():
    rows = dict(plan.check(pipeline(VARIANTS["p4d-efa-spot-trainjob-rack"])).rows)
    assert rows["train: pods"] == (
        "2 TrainJob node pod(s) x 8 torchrun worker(s) (16 in all; runtime ClusterTrainingRuntime torch-distributed)"
    )
    assert rows["train: attempts"].startswith("2 at most")  # Argo's retry; the runtime's restarts are its own
    with pytest.raises(ConfigError) as refused:
        plan.check(pipeline(["cluster.instance_type=trn1.32xlarge", "cluster.launcher=trainjob"]))
    assert str(refused.value) == trainjob.TRAINIUM_REFUSAL
    with pytest.raises(ConfigError, match=r"^cluster\.nodes: Input should be less than or equal to 64"):
        config(["cluster.launcher=trainjob", "cluster.nodes=65"])


def holds(requirement, obj):
    """One requirement as Argo evaluates it: a gjson path (a number indexes a list), `==` on its text."""
    key, op, value = requirement
    found = obj
    for part in key.split("."):
        if isinstance(found, list) and part.isdigit() and int(part) < len(found):
            found = found[int(part)]
        elif isinstance(found, dict) and part in found:
            found = found[part]
        else:
            return op == "!="
    return (str(found) == value) == (op in ("=", "=="))


def condition(kind, status="True", reason="Reason"):
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": kind,
        "lastTransitionTime": "2026-12-07T00:00:00Z",
    }


# Conditions the Trainer v2.3.0 writes (pkg/controller/trainjob_controller.go; the JobSet plugin's Status): a TrainJob
# created suspended gets `Suspended` at its first reconcile, `False` once admitted; the JobSet's end, or the deadline,
# adds `Complete` or `Failed` after it.
STATUSES = {
    "kueue": {
        "queued": [condition("Suspended")],
        "running": [condition("Suspended", "False")],
        "complete": [condition("Suspended", "False"), condition("Complete")],
        "failed": [condition("Suspended", "False"), condition("Failed", reason="FailedJobs")],
        "deadline": [condition("Suspended", "False"), condition("Failed", reason="DeadlineExceeded")],
    },
    "volcano": {
        "running": [],
        "complete": [condition("Complete")],
        "failed": [condition("Failed", reason="FailedJobs")],
    },
}
CASES = [(scheduler, state) for scheduler, states in STATUSES.items() for state in states]


@pytest.mark.parametrize(("scheduler", "state"), CASES, ids=[f"{s}-{t}" for s, t in CASES])
def test_the_resource_templates_conditions_follow_the_trainjob_status(scheduler, state, crd_validator):
    variant = "p4d-efa-spot-trainjob-rack" if scheduler == "kueue" else "cpu-trainjob-2-nodes-volcano"
    train, job = job_of(variant)
    conditions = STATUSES[scheduler][state]
    observed = {**job, "status": {"conditions": conditions}}
    assert errors(crd_validator(observed), observed) == []  # a status the CRD admits
    succeeded = all(holds(r, observed) for r in selector(train["resource"]["successCondition"]))
    failed = any(holds(r, observed) for r in selector(train["resource"]["failureCondition"]))
    assert succeeded == (state == "complete")
    assert failed == (state in ("failed", "deadline"))


@pytest.mark.parametrize("launcher", ["rayjob", "mpijob", "trainjob"])
def test_a_job_and_its_outputs_collector_are_memoized_under_keys_of_their_own(launcher):
    """One cache, so one key would hand the collector the job's entry (saved just before, with no outputs) on a
    workflow's first run, and every task reading the job's outputs would fail."""
    templates = render(["cluster.instance_type=p4d.24xlarge", f"cluster.launcher={launcher}"])["spec"]["templates"]
    memo = {t["name"]: t["memoize"] for t in templates if t["name"] in ("train", "train-outputs")}
    assert memo["train"]["cache"] == memo["train-outputs"]["cache"]
    assert memo["train-outputs"]["key"] == "train-outputs-" + memo["train"]["key"].removeprefix("train-")
